"""Logits processors: each against transformers' own processors (or OpenAI's formula by hand), in one
batch with per-row parameters; then the engine: greedy output with every processor equals
transformers' generate, solo, batched, and with every speculative recipe."""

from __future__ import annotations

import pytest
import torch
import transformers
from staggered import run_staggered

from tandem.engine import Engine, EngineConfig, SamplingParams
from tandem.engine.outputs import RequestMetrics
from tandem.engine.processors import LogitsRow, bad_words_token_ids, process_logits
from tandem.engine.sampler import filtered_probs
from tandem.engine.sequence import Sequence
from tandem.model import Tokenizer, load_model
from tandem.optimize import apply_recipe

VOCAB = 40
EOS = 1
PROMPT = [0, 5, 7, 7, 9, 12]
OUTPUT = [7, 3, 3, 3, 20, 9, 31]


def make_seq(params: SamplingParams, output=OUTPUT, bad_word_ids=(), prompt=PROMPT) -> Sequence:
    seq = Sequence("s", list(prompt), params, None, frozenset({EOS}), 1000, RequestMetrics(0.0))
    seq.output_ids = list(output)
    seq.bad_word_ids = tuple(tuple(w) for w in bad_word_ids)
    return seq


@pytest.fixture
def logits() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(1, VOCAB) * 3


def processed(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    return process_logits(logits, [LogitsRow(seq)])


def test_repetition_penalty_is_transformers_over_prompt_and_output(logits):
    for penalty in (1.3, 0.7):
        ours = processed(logits, make_seq(SamplingParams(repetition_penalty=penalty)))
        ids = torch.tensor([PROMPT + OUTPUT])
        theirs = transformers.RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone())
        torch.testing.assert_close(ours, theirs)


def test_presence_and_frequency_penalties_are_openais_formula_over_output_tokens(logits):
    ours = processed(logits, make_seq(SamplingParams(presence_penalty=0.5, frequency_penalty=-0.3)))
    counts = torch.bincount(torch.tensor(OUTPUT), minlength=VOCAB).float()
    expected = logits - counts * -0.3 - (counts > 0).float() * 0.5  # prompt tokens are not penalized
    torch.testing.assert_close(ours, expected)


def test_logit_bias_adds_to_the_named_tokens(logits):
    bias = {3: 5.0, 11: -100.0, 39: 0.25}
    ours = processed(logits, make_seq(SamplingParams(logit_bias=bias)))
    theirs = transformers.SequenceBiasLogitsProcessor({(t,): b for t, b in bias.items()})(
        torch.tensor([PROMPT + OUTPUT]), logits.clone()
    )
    torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("min_tokens", [len(OUTPUT) + 1, len(OUTPUT)])
def test_min_tokens_bans_eos_and_stop_ids_until_reached(logits, min_tokens):
    params = SamplingParams(max_tokens=50, min_tokens=min_tokens, stop_token_ids=(4, 6))
    ours = processed(logits, make_seq(params))
    ids = torch.tensor([PROMPT + OUTPUT])
    theirs = transformers.MinNewTokensLengthLogitsProcessor(len(PROMPT), min_tokens, [EOS, 4, 6])(ids, logits.clone())
    torch.testing.assert_close(ours, theirs)
    assert torch.isinf(ours[0, [EOS, 4, 6]]).all() == (min_tokens > len(OUTPUT))


def test_bad_words_ban_single_tokens_always_and_sequences_after_their_prefix(logits):
    # [31, 14]: the output ends with 31, so 14 is banned; [9, 31, 8]: ends with 9, 31 -> 8; [20, 2]: no.
    words = [[17], [31, 14], [9, 31, 8], [20, 2]]
    ours = processed(logits, make_seq(SamplingParams(bad_words=("x",)), bad_word_ids=words))
    theirs = transformers.NoBadWordsLogitsProcessor(words)(torch.tensor([OUTPUT]), logits.clone())  # output only
    torch.testing.assert_close(ours, theirs)
    assert torch.isinf(ours[0, [17, 14, 8]]).all() and not torch.isinf(ours[0, 2])


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_min_p_is_transformers_after_temperature(logits, temperature):
    params = SamplingParams(temperature=temperature, min_p=0.15)
    ours = filtered_probs(logits, params)
    scaled = transformers.TemperatureLogitsWarper(temperature)(None, logits.clone())
    theirs = torch.softmax(transformers.MinPLogitsWarper(0.15)(None, scaled), dim=-1)
    torch.testing.assert_close(ours, theirs)
    assert 1 < int((ours > 0).sum()) < VOCAB


def test_one_batch_with_per_row_parameters_equals_each_row_alone(logits):
    torch.manual_seed(1)
    batch = torch.randn(6, VOCAB) * 3
    seqs = [
        make_seq(SamplingParams(repetition_penalty=1.5, presence_penalty=0.2)),
        make_seq(SamplingParams()),  # no processor: untouched
        make_seq(SamplingParams(frequency_penalty=1.0, logit_bias={5: 3.0}), output=[5, 5]),
        make_seq(SamplingParams(max_tokens=20, min_tokens=9, bad_words=("x",)), bad_word_ids=[[2], [31, 4]]),
        make_seq(SamplingParams(repetition_penalty=0.8), prompt=[0, 1, 2]),
    ]
    rows = [LogitsRow(s) for s in seqs] + [LogitsRow(seqs[0], drafted=(31, 31))]
    together = process_logits(batch, rows)
    for i, row in enumerate(rows):
        torch.testing.assert_close(together[i], process_logits(batch[i : i + 1], [row])[0])
    torch.testing.assert_close(together[1], batch[1])
    # A drafted history is the same as that output: verification sees what plain decoding would.
    longer = make_seq(seqs[0].params, output=OUTPUT + [31, 31])
    torch.testing.assert_close(together[5], processed(batch[5:6], longer)[0])


def test_no_processor_returns_the_logits_uncopied(logits):
    assert process_logits(logits, [LogitsRow(make_seq(SamplingParams(min_p=0.5)))]) is logits


def test_bad_words_tokenize_as_vllm_with_and_without_a_leading_space(tiny_llama_dir):
    tok = Tokenizer(tiny_llama_dir)

    def encode(text):
        return tok.encode(text, add_special_tokens=False)

    words = bad_words_token_ids(["return", "  print(i", "zzz"], encode)
    expected = []
    for word in ("return", "print(i", "zzz"):
        bare, spaced = tuple(encode(word)), tuple(encode(" " + word))
        expected.append(bare)
        if spaced[0] != bare[0] and len(spaced) == len(bare):
            expected.append(spaced)
    assert words == tuple(expected)
    assert tuple(encode(" return")) in words  # the word inside text, where the tokenizer merges the space


@pytest.mark.parametrize(
    "field, value",
    [
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3),
        ("repetition_penalty", 0),
        ("repetition_penalty", 1e-300),
        ("min_p", 1.5),
        ("min_tokens", -1),
        ("logit_bias", {3: 101}),
        ("logit_bias", {-1: 1.0}),
        ("bad_words", ("",)),
    ],
)
def test_invalid_processor_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=3, min_tokens=4)


# -- the engine ---------------------------------------------------------------------------------------

CONFIG = EngineConfig(max_model_len=160, kv_cache_tokens=160 * 8)
PROMPTS = [[0, *range(5, 5 + n), *range(5, 5 + n)] for n in (3, 17, 8, 30, 5, 12)]
BAD = ("(self", " import")


class OpenAIPenalties(transformers.LogitsProcessor):
    """presence and frequency penalties over generated tokens, as OpenAI defines them (transformers has none)."""

    def __init__(self, prompt_len: int, presence: float, frequency: float) -> None:
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids, scores):
        generated = input_ids[:, self.prompt_len :]
        counts = torch.zeros_like(scores).scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0)


def param_sets(bad_word_ids):
    def g(**kw):
        return SamplingParams.greedy_params(**kw)

    return [
        (g(max_tokens=24, repetition_penalty=1.8), dict(repetition_penalty=1.8)),
        (g(max_tokens=24, presence_penalty=1.5, frequency_penalty=0.7), dict(presence=1.5, frequency=0.7)),
        (
            g(max_tokens=20, logit_bias={7: 4.0, 11: 2.5, 40: -100}),
            dict(sequence_bias={(7,): 4.0, (11,): 2.5, (40,): -100.0}),
        ),
        (
            g(max_tokens=20, min_tokens=15, logit_bias={EOS: 30.0}),
            dict(min_new_tokens=15, sequence_bias={(EOS,): 30.0}),
        ),
        (
            g(max_tokens=20, bad_words=BAD, repetition_penalty=1.2),
            dict(bad_words_ids=bad_word_ids, repetition_penalty=1.2),
        ),
        (g(max_tokens=20), {}),
    ]


def hf_greedy(hf_model, prompt, params, kwargs) -> list[int]:
    processors = transformers.LogitsProcessorList()
    if "presence" in kwargs:
        processors.append(OpenAIPenalties(len(prompt), kwargs.pop("presence"), kwargs.pop("frequency")))
    if "bad_words_ids" in kwargs:  # vLLM (and tandem) match bad words over generated tokens only
        words = kwargs.pop("bad_words_ids")
        base = transformers.NoBadWordsLogitsProcessor(words)
        processors.append(lambda ids, scores: base(ids[:, len(prompt) :], scores))
    ids = torch.tensor([prompt])
    out = hf_model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=params.max_tokens,
        eos_token_id=EOS,
        pad_token_id=2,
        logits_processor=processors,
        **kwargs,
    )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def cases(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    bad_ids = bad_words_token_ids(BAD, lambda w: model.tokenizer.encode(w, add_special_tokens=False))
    hf_model = transformers.LlamaForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    sets = param_sets([list(w) for w in bad_ids])
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(sets))]
    params = [p for p, _ in sets]
    with torch.no_grad():
        expected = [hf_greedy(hf_model, pr, p, dict(kw)) for pr, (p, kw) in zip(prompts, sets, strict=True)]
        plain = [hf_greedy(hf_model, pr, p, {}) for pr, p in zip(prompts, params, strict=True)]
    # Each processor changed the greedy output (else the comparison proves nothing) ...
    assert all(e != q for e, q in zip(expected[:-1], plain[:-1], strict=True))
    # ... and min_tokens held back EOS (biased +30) for exactly 15 tokens.
    assert len(expected[3]) == 16 and expected[3][-1] == EOS and EOS not in expected[3][:-1]
    return prompts, params, expected


def test_greedy_with_every_processor_equals_transformers_generate_solo(tiny_llama_dir, cases):
    prompts, params, expected = cases
    engine = Engine(load_model(tiny_llama_dir), CONFIG)
    solo = [engine.generate([pr], p)[0].token_ids for pr, p in zip(prompts, params, strict=True)]
    assert solo == expected


def test_greedy_batched_with_arrivals_equals_solo(tiny_llama_dir, cases):
    prompts, params, expected = cases
    engine = Engine(load_model(tiny_llama_dir), CONFIG)
    assert [o.token_ids for o in run_staggered(engine, prompts, params, every=2)] == expected


@pytest.mark.parametrize(
    "recipe",
    [
        "speculative(k=4, max_batch=8, draft={draft})",
        "ngram(k=3)",
        "speculative@2.0(k_max=5, draft={draft})",
        "ngram@2.0(k_max=4)",
        "speculative(k=3, max_batch=8, draft={target})",  # a draft equal to the target: everything accepted
    ],
)
def test_greedy_with_processors_is_identical_under_speculation(recipe, tiny_llama_dir, tiny_draft_dir, cases):
    prompts, params, expected = cases
    recipe = recipe.format(draft=tiny_draft_dir, target=tiny_llama_dir)
    engine = Engine(apply_recipe(load_model(tiny_llama_dir), recipe), CONFIG)
    if "@2.0" in recipe:  # verification flat, drafting free: every length pays, so drafts happen
        from tandem.optimize.draft_length import LinearCost

        engine.speculator.target_cost.estimate = lambda: LinearCost(1.0, 0.0)
        engine.speculator.draft_cost.estimate = lambda: LinearCost(0.0, 0.0)
    assert [o.token_ids for o in run_staggered(engine, prompts, params, every=2)] == expected
    assert engine.num_drafted_tokens > 0
    if "draft=" + str(tiny_llama_dir) in recipe:
        assert engine.num_accepted_tokens == engine.num_drafted_tokens  # the draft applies the processors too
