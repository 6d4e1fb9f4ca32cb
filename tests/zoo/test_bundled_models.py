"""The committed models in models/: HF parity, held-out quality, draft agreement, default use.

No training here: everything runs on the committed weights and the committed held-out sample.
"""

import io
import itertools
import json
import tokenize

import pytest
import torch
import transformers
from click.testing import CliRunner
from tokenizers import Tokenizer

from tandem.cli import cli
from tandem.data.bundled import BUNDLED_MODELS
from tandem.engine import Engine, EngineConfig, SamplingParams
from tandem.model import default_model_dir, load_model
from tandem.zoo.corpus import is_heldout
from tandem.zoo.evaluate import HeldoutScore, model_score, top1_agreement, unigram_counts, unigram_score
from tandem.zoo.sample import load_sample
from tandem.zoo.shapes import matmul_flops_per_token
from tandem.zoo.tokens import encode_files, eval_windows

MODELS = BUNDLED_MODELS
TARGET, DRAFT = MODELS / "tandem-code-target", MODELS / "tandem-code-draft"
REPORT = json.loads((MODELS / "tandem-code-build.json").read_text())


@pytest.fixture(scope="module")
def target():
    return load_model(TARGET)


@pytest.fixture(scope="module")
def draft():
    return load_model(DRAFT)


@pytest.fixture(scope="module")
def sample_windows():
    tokenizer = Tokenizer.from_file(str(TARGET / "tokenizer.json"))
    stream = encode_files(tokenizer, load_sample(MODELS / "tandem-code-heldout-sample.json"), 0, 1)
    return eval_windows(stream, REPORT["config"]["seq_len"])


class Replayed:
    """A module's logits for the held-out windows, computed once in batched forwards (windows of one
    length stacked, BATCH at a time) and handed back window by window: `model_score` and `top1_agreement`
    run on it as on the module (`module.logits(module(window[None, :-1]))`), without a forward each."""

    BATCH = 8

    def __init__(self, module, windows) -> None:
        self.by_input: dict[tuple[int, ...], torch.Tensor] = {}
        inputs = [w[:-1] for w in windows if len(w) >= 2]
        for length in sorted({len(x) for x in inputs}):
            same = [x for x in inputs if len(x) == length]
            for start in range(0, len(same), self.BATCH):
                batch = torch.stack(same[start : start + self.BATCH])
                with torch.no_grad():
                    logits = module.logits(module(batch))
                for row, x in zip(logits, batch, strict=True):
                    self.by_input[tuple(x.tolist())] = row

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        (x,) = tokens
        return self.by_input[tuple(x.tolist())][None]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden  # __call__ already gave the logits


@pytest.fixture(scope="module")
def replayed(target, draft, sample_windows) -> dict[str, Replayed]:
    """Each bundled model's held-out logits, shared by the perplexity and the agreement test."""
    return {"target": Replayed(target.module, sample_windows), "draft": Replayed(draft.module, sample_windows)}


def test_default_model_is_the_bundled_target(target):
    assert default_model_dir() == TARGET
    config = target.config
    assert config.architecture == "LlamaForCausalLM" and 10e6 <= config.num_parameters <= 30e6
    assert config.vocab_size == target.tokenizer.vocab_size == 8192
    tokenizer_config = json.loads((TARGET / "tokenizer_config.json").read_text())
    assert config.max_position_embeddings == tokenizer_config["model_max_length"] == REPORT["config"]["seq_len"]


def test_draft_costs_at_most_an_eighth_of_the_target(target, draft):
    assert draft.tokenizer.vocab_size == target.tokenizer.vocab_size
    assert (DRAFT / "tokenizer.json").read_bytes() == (TARGET / "tokenizer.json").read_bytes()
    for context in (0, target.config.max_position_embeddings):
        ratio = matmul_flops_per_token(draft.config, context) / matmul_flops_per_token(target.config, context)
        assert ratio <= 1 / 8


@pytest.mark.parametrize("name", ["target", "draft"])
def test_logits_match_transformers(name, request, sample_windows):
    ours = request.getfixturevalue(name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(ours.path, dtype=torch.float32).eval()
    tokens = sample_windows[0][None, :-1]
    with torch.no_grad():
        expected = hf(tokens).logits
        actual = ours.module.logits(ours.module(tokens))
    assert torch.allclose(actual, expected, atol=1e-4, rtol=0), (actual - expected).abs().max()


def test_greedy_generation_matches_transformers(target):
    hf = transformers.AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    prompt = target.tokenizer.encode("import os\n\n\ndef walk(top):\n")
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False)
    engine = Engine(target, EngineConfig(max_model_len=128, kv_cache_tokens=256, max_num_seqs=1))
    out = engine.generate([prompt], SamplingParams.greedy_params(24, ignore_eos=True))[0]
    assert out.token_ids == ref[0, len(prompt) :].tolist()


def test_the_replayed_logits_are_the_modules_own(target, replayed, sample_windows):
    for window in (sample_windows[0], sample_windows[-1]):  # a full window and the shorter last one
        tokens = window[None, :-1]
        with torch.no_grad():
            expected = target.module.logits(target.module(tokens))
        assert torch.allclose(replayed["target"](tokens), expected, atol=1e-4, rtol=0)


def test_heldout_perplexity_is_far_below_a_unigram_model(replayed, sample_windows):
    targets = torch.cat([w[1:] for w in sample_windows])
    # The sample's own token frequencies: no unigram model can score these tokens better.
    best_unigram = unigram_score(unigram_counts(targets, 8192) - 1, sample_windows)  # no smoothing
    ours, small = model_score(replayed["target"], sample_windows), model_score(replayed["draft"], sample_windows)
    assert ours.tokens == best_unigram.tokens == len(targets) > 5000
    # Measured: 66.6 vs 488 for the best possible unigram on these very tokens (7.3x lower).
    assert ours.perplexity < best_unigram.perplexity / 5
    assert ours.perplexity < small.perplexity < best_unigram.perplexity / 4
    # The card's numbers (all held-out files, train-fitted unigram) say the same.
    unigram = HeldoutScore(REPORT["unigram"]["tokens"], REPORT["unigram"]["loss"])
    assert REPORT["target"]["heldout"]["perplexity"] < unigram.perplexity / 10  # 68.5 vs 867


def test_draft_agrees_with_target_on_heldout_code(replayed, sample_windows):
    agreement = top1_agreement(replayed["target"], replayed["draft"], sample_windows)
    assert agreement >= 0.60
    assert agreement == pytest.approx(REPORT["agreement"]["sample"], abs=0.002)  # the card's number


def test_sample_is_heldout_code_with_provenance():
    payload = json.loads((MODELS / "tandem-code-heldout-sample.json").read_text())
    paths = [f["path"] for f in payload["files"]]
    assert paths and set(paths) <= set(REPORT["corpus"]["heldout_paths"])
    assert all(is_heldout(p, REPORT["config"]["heldout_fraction"]) for p in paths)
    assert "Python Software Foundation" in payload["license"]
    assert 20_000 < sum(len(f["text"].encode()) for f in payload["files"]) < 100_000


def _python_tokens(text: str) -> list[tokenize.TokenInfo]:
    """Python's own tokenizer over `text`, up to where the completion was cut off."""
    tokens = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            tokens.append(token)
    except (tokenize.TokenError, IndentationError):
        pass  # the completion stops mid-statement at max_tokens
    return tokens


def test_generate_without_a_model_completes_python():
    result = CliRunner().invoke(cli, ["generate", "--prompt", "def fibonacci(n):", "--max-tokens", "64"])
    assert result.exit_code == 0, result.output
    text = result.output
    assert text.startswith("def fibonacci(n):\n    ")  # an indented body follows the def line
    assert "return" in text or "if " in text
    # Python-shaped: up to the first token Python's tokenizer cannot read (if any), it is code
    # (names, operators, literals, docstrings), not just comments and blank lines. (A 16M model's
    # greedy completion repeats itself: plausible, not correct. Its exact text depends on the
    # host's int8 path, the VNNI kernel or fbgemm with 7-bit weights on an AVX2-only CPU; on the
    # latter it wrote a docstring and a `return` call whose raw-string argument ended in `=?'`.)
    tokens = list(itertools.takewhile(lambda t: t.type != tokenize.ERRORTOKEN, _python_tokens(text)))
    code = {tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.STRING}
    assert sum(t.type in code for t in tokens) >= 10, tokens
    assert any(t.string in ("return", "if") for t in tokens), tokens


def test_models_fit_the_repository_budget():
    size = sum(p.stat().st_size for p in MODELS.rglob("*") if p.is_file())
    assert size <= 80 * 2**20
