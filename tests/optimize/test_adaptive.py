"""Adaptive speculation (speculative@2.0, ngram@2.0): greedy output is the target's own, sampled output
keeps the target's distribution, and the draft length follows acceptance and costs."""

import pytest
import torch
from scipy.stats import chisquare
from staggered import run_staggered

from tandem.engine import Engine, EngineConfig, SamplingParams
from tandem.engine.sampler import filtered_probs
from tandem.model import load_model
from tandem.optimize import apply_recipe
from tandem.optimize.draft_length import LinearCost

CONFIG = EngineConfig(max_model_len=160, kv_cache_tokens=160 * 6)
PROMPTS = [[0, *range(5, 5 + n), *range(5, 5 + n)] for n in (2, 17, 40, 9, 60, 4, 25)]
PARAMS = [SamplingParams.greedy_params(12 + 7 * i, ignore_eos=True) for i in range(len(PROMPTS))]


def force_costs(engine, target=LinearCost(1.0, 0.0), draft=LinearCost(0.0, 0.0)):
    """Pin the speculator's cost lines (the default here: verification flat, drafting free, so every
    length pays); real timings of tiny test models say nothing about the policy."""
    engine.speculator.target_cost.estimate = lambda: target
    engine.speculator.draft_cost.estimate = lambda: draft
    return engine


@pytest.fixture(scope="module")
def baseline_tokens(tiny_llama_dir):
    return [o.token_ids for o in Engine(load_model(tiny_llama_dir), CONFIG).generate(PROMPTS, PARAMS)]


@pytest.mark.parametrize(
    "recipe, forced",
    [
        ("speculative@2.0(k_max=6, draft={draft})", True),
        ("speculative@2.0(k_max=4, lookup=false, draft={draft})", True),
        ("ngram@2.0(k_max=5)", True),
        ("speculative@2.0(draft={draft})", False),  # whatever the measured costs choose
    ],
)
def test_greedy_output_identical_to_target_alone(recipe, forced, tiny_llama_dir, tiny_draft_dir, baseline_tokens):
    engine = Engine(apply_recipe(load_model(tiny_llama_dir), recipe.format(draft=tiny_draft_dir)), CONFIG)
    if forced:
        force_costs(engine)
    assert [o.token_ids for o in run_staggered(engine, PROMPTS, PARAMS, every=3)] == baseline_tokens
    if forced:
        assert engine.num_drafted_tokens > 0 and 0 <= engine.num_accepted_tokens <= engine.num_drafted_tokens


def test_a_draft_the_target_always_accepts_drafts_the_longest_length(tiny_llama_dir):
    recipe = f"speculative@2.0(k_max=5, lookup=false, draft={tiny_llama_dir})"
    engine = force_costs(Engine(apply_recipe(load_model(tiny_llama_dir), recipe), CONFIG))
    engine.generate(PROMPTS[:1], SamplingParams.greedy_params(60, ignore_eos=True))
    assert engine.acceptance_rate == 1.0
    assert engine.mean_acceptance_length > 5.0  # k_max + 1 per step, but for the capped last steps


def test_no_drafting_where_verification_costs_full_price_but_a_probe_now_and_then(tiny_llama_dir, tiny_draft_dir):
    recipe = f"speculative@2.0(k_max=4, lookup=false, probe_every=8, draft={tiny_draft_dir})"
    engine = Engine(apply_recipe(load_model(tiny_llama_dir), recipe), CONFIG)
    # Every verified token costs as much as a whole plain step: drafting can never pay.
    force_costs(engine, target=LinearCost(0.0, 1.0), draft=LinearCost(1.0, 0.0))
    engine.generate(PROMPTS[:2], SamplingParams.greedy_params(33, ignore_eos=True))
    steps = 32  # decoding steps after the prefill
    assert 0 < engine.num_spec_rows <= 2 * (steps // 8 + 1)  # only the probes drafted (one token per row)
    assert engine.num_drafted_tokens == engine.num_spec_rows


def test_sampled_output_keeps_the_targets_distribution(tiny_llama_dir, tiny_draft_dir):
    """Two tokens after a prompt, many seeds: the second token (drawn through draft or lookup proposals
    and rejection sampling) follows the target's exact marginal sum_t1 p(t1) p(t2 | t1)."""
    model = load_model(tiny_llama_dir)
    prompt = PROMPTS[1]
    params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=4, seed=s, ignore_eos=True) for s in range(1200)]
    recipe = f"speculative@2.0(k_max=3, draft={tiny_draft_dir})"
    engine = force_costs(Engine(apply_recipe(model, recipe), EngineConfig(max_model_len=160, kv_cache_tokens=160 * 48)))
    outs = engine.generate([prompt] * len(params), params)
    assert engine.num_drafted_tokens > 600  # the second and third tokens went through verification
    second = torch.bincount(torch.tensor([o.token_ids[1] for o in outs]), minlength=model.config.vocab_size)
    with torch.inference_mode():
        module = load_model(tiny_llama_dir).module
        p1 = filtered_probs(module.logits(module(torch.tensor([prompt])))[0, -1], params[0])
        firsts = torch.nonzero(p1).flatten()
        rows = torch.tensor([[*prompt, int(t)] for t in firsts])
        p2 = filtered_probs(module.logits(module(rows))[:, -1], params[0])
    marginal = (p1[firsts, None] * p2).sum(0)
    support = marginal > 0
    assert second[~support].sum() == 0
    expected = marginal[support].double()
    expected = expected / expected.sum() * len(outs)
    result = chisquare(second[support].double().numpy(), expected.numpy())
    assert result.pvalue > 1e-3, (second[support], expected)
