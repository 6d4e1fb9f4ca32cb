"""The draft-length policy: expected tokens, the rate-maximizing k, per-row lengths, and the online estimators."""

import random

import pytest

from tandem.optimize.draft_length import (
    Acceptance,
    CostFit,
    LinearCost,
    choose_draft_length,
    expected_tokens,
    row_draft_lengths,
    step_rate,
)

# Shaped like the bundled pair on this CPU: a target forward ~3 ms + 0.14 ms per token, a draft
# forward ~0.45 ms + 0.03 ms per row.
TARGET = LinearCost(3e-3, 1.4e-4)
DRAFT = LinearCost(4.5e-4, 3e-5)
FREE = LinearCost(0.0, 0.0)


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_a_single_row_with_good_acceptance_drafts_several_tokens():
    k, rate = choose_draft_length([0.8], TARGET, DRAFT, k_max=8)
    assert 3 <= k <= 8
    assert rate > 1.5 * step_rate([0.8], 0, TARGET, DRAFT)  # worth it: well above plain decoding


def test_drafting_shrinks_then_stops_as_the_batch_grows_or_acceptance_falls():
    lengths = [choose_draft_length([0.8] * batch, TARGET, DRAFT, 8)[0] for batch in (1, 4, 16, 64)]
    assert lengths == sorted(lengths, reverse=True) and lengths[0] > lengths[-1]
    assert choose_draft_length([0.8] * 64, TARGET, DRAFT, 8)[0] == 0  # verification costs full price
    assert choose_draft_length([0.05], TARGET, DRAFT, 8)[0] == 0  # a draft the target rejects
    # Free proposals (prompt lookup) with cheap verification: the longest draft pays.
    assert choose_draft_length([0.9], LinearCost(3e-3, 0.0), FREE, 8)[0] == 8


def test_prefill_tokens_in_the_step_count_toward_its_cost():
    alone = step_rate([0.8], 3, TARGET, DRAFT)
    assert step_rate([0.8], 3, TARGET, DRAFT, other_tokens=400) < alone


def test_rows_the_target_rejects_draft_fewer_tokens():
    k, rate = choose_draft_length([0.95, 0.9, 0.3], TARGET, DRAFT, 8)
    lengths = row_draft_lengths([0.95, 0.9, 0.3], k, rate, TARGET.per_unit)
    assert lengths[0] == k and lengths[0] >= lengths[1] > lengths[2]


def test_cost_fit_recovers_a_line_from_noisy_timings():
    rng = random.Random(0)
    fit = CostFit(LinearCost(1.0, 0.05))
    for _ in range(300):
        tokens = rng.choice([1, 2, 4, 8, 16, 32, 64])
        fit.add(tokens, TARGET(tokens) * rng.uniform(0.95, 1.05))
    line = fit.estimate()
    assert line.base == pytest.approx(TARGET.base, rel=0.1)
    assert line.per_unit == pytest.approx(TARGET.per_unit, rel=0.15)


def test_cost_fit_keeps_the_priors_shape_without_spread_in_its_units():
    fit = CostFit(LinearCost(1.0, 0.05))
    for _ in range(50):
        fit.add(8, 0.01)  # always 8 tokens: the slope is not identifiable from the data
    line = fit.estimate()
    assert line(8) == pytest.approx(0.01, rel=0.05)
    assert line.per_unit == pytest.approx(line.base * 0.05, rel=0.3)
    fit.add(8, 0.0)  # a zero timing (a fake clock) is ignored


def test_acceptance_estimates_the_per_token_rate_of_truncated_runs():
    rng = random.Random(1)
    estimate = Acceptance(decay=1.0)
    for _ in range(2000):
        k = rng.choice([2, 4, 8])
        accepted = 0
        while accepted < k and rng.random() < 0.7:
            accepted += 1
        estimate.add(k, accepted)
    assert estimate.rate == pytest.approx(0.7, abs=0.02)
    assert Acceptance(prior=0.6).rate == 0.6  # no evidence: the prior
