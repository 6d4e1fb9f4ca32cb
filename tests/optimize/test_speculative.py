"""Speculative decoding: greedy output identical to the target alone; sampling keeps its distribution."""

import pytest
import torch
from scipy.stats import chisquare
from staggered import run_staggered

from tandem.engine import Engine, EngineConfig, SamplingParams
from tandem.engine.outputs import RequestMetrics
from tandem.engine.sampler import new_generator
from tandem.engine.sequence import Sequence
from tandem.engine.speculation import Proposal, verify
from tandem.model import load_model
from tandem.optimize import apply_recipe

CONFIG = EngineConfig(max_model_len=160, kv_cache_tokens=160 * 6)
# Repetitive prompts give n-gram lookup something to find; mixed lengths exercise chunked prefill.
PROMPTS = [[0, *range(5, 5 + n), *range(5, 5 + n)] for n in (2, 17, 40, 9, 60, 4, 25)]
PARAMS = [SamplingParams.greedy_params(12 + 7 * i, ignore_eos=True) for i in range(len(PROMPTS))]


@pytest.fixture(scope="module")
def baseline_tokens(tiny_llama_dir):
    engine = Engine(load_model(tiny_llama_dir), CONFIG)
    return [o.token_ids for o in engine.generate(PROMPTS, PARAMS)]


@pytest.mark.parametrize(
    "recipe",
    [
        "speculative(k=4, max_batch=8, draft={draft})",
        "speculative(k=2, max_batch=3, draft={draft})",
        "ngram(k=3)",
        "ngram(k=5, n=2, max_batch=2)",
    ],
)
def test_greedy_output_identical_to_target_alone(recipe, tiny_llama_dir, tiny_draft_dir, baseline_tokens):
    optimized = apply_recipe(load_model(tiny_llama_dir), recipe.format(draft=tiny_draft_dir))
    engine = Engine(optimized, CONFIG)
    assert [o.token_ids for o in run_staggered(engine, PROMPTS, PARAMS, every=3)] == baseline_tokens
    # A random draft may agree with the random target rarely; the counters must still add up.
    assert engine.num_drafted_tokens > 0 and 0 <= engine.num_accepted_tokens <= engine.num_drafted_tokens
    assert 1.0 <= engine.mean_acceptance_length <= 1 + int(recipe.split("k=")[1][0])


def test_draft_identical_to_target_accepts_everything(tiny_llama_dir):
    optimized = apply_recipe(load_model(tiny_llama_dir), f"speculative(k=4, draft={tiny_llama_dir})")
    engine = Engine(optimized, CONFIG)
    engine.generate(PROMPTS[:2], SamplingParams.greedy_params(30, ignore_eos=True))
    assert engine.acceptance_rate == 1.0
    per_request = engine.num_accepted_tokens
    assert per_request > 0


def test_speculation_switches_off_above_max_batch(tiny_llama_dir, tiny_draft_dir):
    optimized = apply_recipe(load_model(tiny_llama_dir), f"speculative(k=3, max_batch=2, draft={tiny_draft_dir})")
    engine = Engine(optimized, CONFIG)
    for p in PROMPTS[:4]:
        engine.add_request(p, SamplingParams.greedy_params(6, ignore_eos=True))
    engine.step()  # prefill all four
    engine.step()  # four decoding rows > max_batch: plain decoding
    assert engine.num_drafted_tokens == 0


def test_draft_with_another_vocabulary_is_refused(tiny_llama_dir, tmp_path):
    from tiny_models import save_tiny

    other = save_tiny("llama", tmp_path / "other", vocab_size=400)
    with pytest.raises(ValueError, match="draft vocabulary \\(400\\) differs"):
        apply_recipe(load_model(tiny_llama_dir), f"speculative(draft={other})")


# -- rejection sampling keeps the target's distribution --------------------------------------------

VOCAB = 6


def make_seq(params, seed):
    seq = Sequence("s", [1], params, None, frozenset(), 100, RequestMetrics(0.0))
    seq.generator = new_generator(seed)
    return seq


def emitted_distribution(proposal_fn, params, trials=3000):
    torch.manual_seed(0)
    target_logits = torch.randn(3, VOCAB) * 1.5  # positions 0..2 for k = 2
    counts = torch.zeros(VOCAB)
    seq = make_seq(params, seed=1234)
    for _ in range(trials):
        proposal = proposal_fn(seq)
        ((tokens, _),) = verify([seq], [proposal], target_logits[None])
        counts[tokens[0]] += 1
    from tandem.engine.sampler import filtered_probs

    return counts, filtered_probs(target_logits[0], params)


def draft_proposal(seq):
    draft_logits = torch.tensor([[2.0, 0.0, -1.0, 1.0, 0.5, -2.0], [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]])
    from tandem.engine.sampler import filtered_probs

    q = filtered_probs(draft_logits, seq.params)
    tokens = [int(torch.multinomial(q[j], 1, generator=seq.generator)) for j in range(2)]
    return Proposal(tokens, q)


def point_proposal(seq):
    return Proposal([3, 0])  # n-gram style: a fixed guess, q is a point mass


@pytest.mark.parametrize("proposal_fn", [draft_proposal, point_proposal])
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=4)])
def test_first_emitted_token_follows_the_target_distribution(proposal_fn, params):
    counts, p = emitted_distribution(proposal_fn, params)
    support = p > 0
    assert counts[~support].sum() == 0  # never emits a token the target's filters exclude
    expected = p[support] * counts.sum()
    result = chisquare(counts[support].numpy(), expected.numpy())
    assert result.pvalue > 1e-3, (counts, expected)
