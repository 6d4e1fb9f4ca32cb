"""The issue's bars on the bundled model: speculative and n-gram greedy output token-identical to
baseline on 50 held-out prompts in continuous batching; int8 perplexity within 2% and top-1
agreement at least 95%."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from tandem.data.bundled import BUNDLED_MODELS
from tandem.engine import Engine, EngineConfig, SamplingParams
from tandem.model import default_model_dir, load_model
from tandem.optimize import apply_recipe

MODELS = BUNDLED_MODELS
SAMPLE = MODELS / "tandem-code-heldout-sample.json"


@pytest.fixture(scope="module")
def heldout_ids():
    tokenizer = load_model(default_model_dir()).tokenizer
    texts = [f["text"] for f in json.loads(SAMPLE.read_text())["files"]]
    return [tokenizer.encode(t) for t in texts]


@pytest.fixture(scope="module")
def prompts(heldout_ids):
    """50 prompts of mixed lengths cut from held-out files, each with its own output length."""
    out = []
    i = 0
    while len(out) < 50:
        ids = heldout_ids[i % len(heldout_ids)]
        length = 8 + (17 * len(out)) % 120
        start = (31 * len(out)) % max(1, len(ids) - length)
        if len(ids) > length:
            out.append((ids[start : start + length], 4 + (7 * len(out)) % 29))
        i += 1
    return out


@pytest.fixture(scope="module")
def baseline_outputs(prompts):
    engine = Engine(load_model(), EngineConfig(max_num_seqs=16))
    params = [SamplingParams.greedy_params(n, ignore_eos=True) for _, n in prompts]
    return [o.token_ids for o in engine.generate([p for p, _ in prompts], params)]


@pytest.mark.parametrize("recipe", ["speculative(k=4, max_batch=16)", "ngram(k=4, max_batch=16)"])
def test_speculative_recipes_are_token_identical_to_baseline(recipe, prompts, baseline_outputs):
    engine = Engine(apply_recipe(load_model(), recipe), EngineConfig(max_num_seqs=16))
    final, submitted, step = {}, 0, 0
    while len(final) < len(prompts):
        # Arrivals spread over the run: sequences join and leave batches of changing size.
        for _ in range(2 if step % 2 == 0 else 0):
            if submitted < len(prompts):
                prompt, n = prompts[submitted]
                engine.add_request(prompt, SamplingParams.greedy_params(n, ignore_eos=True), str(submitted))
                submitted += 1
        for out in engine.step():
            if out.finished:
                final[int(out.request_id)] = out.token_ids
        step += 1
    outputs = [final[i] for i in range(len(prompts))]
    mismatched = [i for i, (a, b) in enumerate(zip(outputs, baseline_outputs, strict=True)) if a != b]
    assert not mismatched, f"{len(mismatched)} of 50 differ, first: {mismatched[:5]}"
    assert engine.num_accepted_tokens > 0.2 * engine.num_drafted_tokens


def windows(heldout_ids, length=256):
    return [torch.tensor(ids[i : i + length]) for ids in heldout_ids for i in range(0, len(ids) - 32, length)]


RECIPE = "int8"  # LM head included


def test_int8_perplexity_and_agreement(heldout_ids):
    """One forward per model over 16 full 256-token windows at once: perplexity and top-1 from the same logits."""
    batch = torch.stack([w for w in windows(heldout_ids) if len(w) == 256][:16])
    targets = batch[:, 1:].reshape(-1)
    scores = {}
    with torch.no_grad():
        for name, module in (("base", load_model().module), ("int8", apply_recipe(load_model(), RECIPE).model.module)):
            logits = module.logits(module(batch))[:, :-1].reshape(len(targets), -1)
            nll = F.cross_entropy(logits, targets).item()
            scores[name] = (math.exp(nll), logits.argmax(-1))
    (base_ppl, base_top), (int8_ppl, int8_top) = scores["base"], scores["int8"]
    assert int8_ppl <= 1.02 * base_ppl, (int8_ppl, base_ppl)
    agreement = (base_top == int8_top).float().mean().item()
    assert agreement >= 0.95, agreement
    print(f"perplexity {base_ppl:.3f} -> {int8_ppl:.3f}, top-1 agreement {agreement:.3f}")
