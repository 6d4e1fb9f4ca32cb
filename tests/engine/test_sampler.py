"""Sampler: top-k and top-p cut the distribution as specified; sampling follows it."""

import pytest
import torch
from scipy.stats import chisquare

from tandem.engine.sampler import filtered_probs, new_generator, sample
from tandem.engine.sampling_params import SamplingParams

LOGITS = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))


def test_top_k_keeps_the_k_most_likely():
    probs = filtered_probs(LOGITS, SamplingParams(top_k=2))
    assert torch.allclose(probs, torch.tensor([0.5, 0.2, 0, 0, 0]) / 0.7)


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs = filtered_probs(LOGITS, SamplingParams(top_p=0.8))
    assert torch.allclose(probs, torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85)
    only_top = filtered_probs(LOGITS, SamplingParams(top_p=0.1))
    assert torch.allclose(only_top, torch.tensor([1.0, 0, 0, 0, 0]))


def test_temperature_sharpens():
    cold = filtered_probs(LOGITS, SamplingParams(temperature=0.5))
    assert cold[0] > 0.5 and torch.isclose(cold.sum(), torch.tensor(1.0))


ALPHA = 0.001  # the chi-square tests' significance level
DRAWS = 20_000


def _softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The expected distribution, written out here (not the sampler's own filtered_probs)."""
    weights = torch.exp(logits.double() / temperature)
    return weights / weights.sum()


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.5])
def test_sampling_frequencies_follow_the_tempered_distribution(temperature):
    """A chi-square goodness-of-fit test at ALPHA over DRAWS seeded draws: the counts fit softmax(logits / T),
    and the same counts reject a temperature 10% off either way (so the test can tell)."""
    params = SamplingParams(temperature=temperature)
    gen = new_generator(1234)
    tokens, _ = sample(LOGITS[None].repeat(DRAWS, 1), [params] * DRAWS, [gen] * DRAWS)
    counts = torch.bincount(torch.tensor(tokens), minlength=len(LOGITS)).double()

    def p_value(t: float) -> float:
        return chisquare(counts.numpy(), (_softmax(LOGITS, t) * DRAWS).numpy()).pvalue

    assert p_value(temperature) > ALPHA, counts.tolist()
    assert p_value(temperature * 1.1) < ALPHA and p_value(temperature / 1.1) < ALPHA, counts.tolist()


def test_top_k_and_top_p_sampling_draws_only_the_kept_tokens_in_proportion():
    params = SamplingParams(temperature=1.0, top_k=3, top_p=0.9)  # keeps 0.5, 0.2, 0.15, renormalized
    gen = new_generator(99)
    tokens, _ = sample(LOGITS[None].repeat(DRAWS, 1), [params] * DRAWS, [gen] * DRAWS)
    counts = torch.bincount(torch.tensor(tokens), minlength=len(LOGITS)).double()
    assert counts[3:].sum() == 0, counts.tolist()
    expected = torch.tensor([0.5, 0.2, 0.15], dtype=torch.float64) / 0.85 * DRAWS
    assert chisquare(counts[:3].numpy(), expected.numpy()).pvalue > ALPHA, counts.tolist()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(max_tokens=-1), "max_tokens"),
        (dict(prompt_logprobs=21), "prompt_logprobs"),
        (dict(temperature=-1), "temperature"),
        (dict(top_p=0), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(logprobs=99), "logprobs"),
        (dict(stop=("",)), "stop"),
        (dict(seed=-3), "seed"),
    ],
)
def test_invalid_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_vanishing_temperature_and_top_p_are_greedy_not_nan():
    logits = torch.tensor([[0.1, 3.0, 0.2, 0.3]])
    tiny_t = SamplingParams(temperature=1e-30, seed=1)
    tiny_p = SamplingParams(temperature=1.0, top_p=1e-45, seed=1)
    assert tiny_t.greedy
    for params in (tiny_t, tiny_p):
        tokens, _ = sample(logits, [params], [new_generator(1)])
        assert tokens == [1]


def test_logprobs_of_many_rows_in_one_batch_are_each_rows_own():
    torch.manual_seed(3)
    logits = torch.randn(4, 50) * 2
    params = [SamplingParams.greedy_params(logprobs=n) for n in (None, 0, 3, 20)]
    tokens, entries = sample(logits, params, [None] * 4)
    assert entries[0] is None and entries[1].top == {}
    for row in (2, 3):
        expected = torch.log_softmax(logits[row], dim=-1)
        n = params[row].logprobs
        values, ids = torch.topk(expected, n)
        assert entries[row].token_id == tokens[row] == int(logits[row].argmax())
        assert entries[row].logprob == pytest.approx(float(expected[tokens[row]]))
        assert list(entries[row].top) == ids.tolist()
        assert list(entries[row].top.values()) == pytest.approx(values.tolist())
