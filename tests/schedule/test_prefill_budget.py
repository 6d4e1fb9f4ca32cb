"""Admission by prompt tokens (PrefillBudget through AdmissionCap), on hand-made cases.

The profiles decode 25 tokens/s per sequence at any batch up to 16 (an iteration takes 40 ms); prefill runs
at 5,000 (SLOW_PREFILL) or 10,000 (FLAT) prompt tokens/s. TPOT target 100 ms.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tandem.contracts import ReplicaLoad
from tandem.schedule.policies import TokenDemand
from tandem.schedule.policies.prefill_budget import prefill_budget
from tandem.schedule.routers import AdmissionCap, LeastOutstanding, PrefixMatch, RouteRequest, paced, uncached_tokens

from .helpers import FakeClock, profile

FLAT = profile({1: 25.0, 16: 400.0}, prefill=10_000.0)
SLOW_PREFILL = profile({1: 25.0, 16: 400.0}, prefill=5_000.0)
CODE = TokenDemand(prompt_tokens_per_s=2000.0, output_tokens_per_s=30.0, requests_per_s=1.0)  # 2k prompts, 30 out
CHAT = TokenDemand(prompt_tokens_per_s=200.0, output_tokens_per_s=200.0, requests_per_s=1.0)


def test_a_long_prompt_mix_leaves_less_than_a_prompt_of_room():
    # 66.7 prompt tokens per output token at 5,000 tokens/s: 13.3 ms of prefill per row and iteration, so the SLO
    # batch is 4 (40 + 4 x 13.3 = 93.3 ms). The 6.7 ms left per iteration, over a row's 29 tokens after its
    # first, carries 6.7 ms x 5,000 x 29 = 967 prompt tokens: under one 2,000-token prompt.
    budget = prefill_budget(SLOW_PREFILL, 0.1, CODE)
    assert budget.tokens == pytest.approx((0.1 - 0.04 - 4 * 2000 / 30 / 5000) * 5000 * 29)
    assert budget.admits(0, 2000)  # nothing left to prefill: the next prompt goes in, however long
    assert not budget.admits(1500, 2000)  # one prompt still prefilling: the next waits
    assert budget.admits(500, 400)  # a short one fits beside what is left


def test_short_prompts_have_room_for_a_burst():
    # 1 prompt token per output token at 10,000 tokens/s: 0.1 ms per row, the SLO batch is every slot (16:
    # 41.6 ms an iteration); 58.4 ms left per iteration over 199 tokens carries ~116k prompt tokens.
    budget = prefill_budget(FLAT, 0.1, CHAT)
    assert budget.tokens == pytest.approx((0.1 - 0.04 - 16 * 1 / 10_000) * 10_000 * 199)
    assert budget.admits(20 * 200, 200)


def test_no_mix_no_token_cap():
    assert prefill_budget(FLAT, 0.1, TokenDemand()) is None
    assert prefill_budget(profile({1: 25.0, 16: 400.0}), 0.1, CODE) is None  # no prefill rate measured


def test_a_past_slo_batch_leaves_no_room_beyond_one_prompt_at_a_time():
    budget = prefill_budget(SLOW_PREFILL, 0.03, CODE)  # even batch 1 takes 40 ms: no slack at all
    assert budget.tokens == 0.0
    assert budget.admits(0, 2000) and not budget.admits(1, 1)


def _route(router, prompts, replicas):
    """Route `prompts` in order, each choice adding its prompt to the chosen replica's load; the prompts
    placed (replica id or None: waits at the gateway). FCFS: after the first that waits, all wait."""
    loads = {r.replica_id: r for r in replicas}
    placed = []
    for prompt in prompts:
        choice = router.choose(RouteRequest(prompt_tokens=prompt), list(loads.values())) if None not in placed else None
        placed.append(choice.replica_id if choice else None)
        if choice:
            pending = choice.prefill_tokens + prompt
            loads[choice.replica_id] = ReplicaLoad(
                choice.replica_id, "local", "v", choice.running + 1, 0, 0.0, True, prefill_tokens=pending
            )
    return placed


def _idle(*ids):
    return [ReplicaLoad(i, "local", "v", 1, 0, 0.0, True) for i in ids]  # one row decoding, nothing to prefill


def test_a_burst_of_long_prompts_is_held_back_at_the_gateway():
    budget = prefill_budget(SLOW_PREFILL, 0.1, CODE)
    capped = AdmissionCap(LeastOutstanding(), lambda: 5, lambda: budget)
    assert _route(capped, [2000] * 4, _idle("a", "b")) == ["a", "b", None, None]  # one prompt each, the rest wait
    by_count = AdmissionCap(LeastOutstanding(), lambda: 5)  # the request cap alone fills the free slots
    assert None not in _route(by_count, [2000] * 4, _idle("a", "b"))


def test_short_prompts_are_admitted_up_to_the_request_cap():
    budget = prefill_budget(FLAT, 0.1, CHAT)
    capped = AdmissionCap(LeastOutstanding(), lambda: 17, lambda: budget)
    placed = _route(capped, [200] * 34, _idle("a", "b"))
    assert placed.count("a") == placed.count("b") == 16 and placed[-2:] == [None, None]  # the request cap binds


def test_without_a_budget_yet_the_token_cap_is_off():
    capped = AdmissionCap(LeastOutstanding(), lambda: None, lambda: None)
    assert None not in _route(capped, [4000] * 6, _idle("a"))


def test_the_pace_keeps_a_rows_tpot_under_a_continuous_stream_of_prompts():
    # 40 ms of decode per iteration at any batch: prompts sent at P tokens/s take P / 5,000 of every second, so
    # the rows decode at 40 ms / (1 - P / 5,000); at the pace, (1 - 40/100) x 5,000 = 3,000 tokens/s, that is 100 ms.
    budget = prefill_budget(SLOW_PREFILL, 0.1, CODE)
    assert budget.pace(4) == pytest.approx(3000.0) and budget.pace(1000) == pytest.approx(3000.0)
    pace = budget.pace(4)
    assert 0.04 / (1 - pace / 5000.0) == pytest.approx(0.1)


def test_the_depth_is_spent_over_a_short_rows_life():
    short = replace(CODE, short_output_tokens=11)
    mean, tail = prefill_budget(SLOW_PREFILL, 0.1, CODE), prefill_budget(SLOW_PREFILL, 0.1, short)
    assert tail.tokens == pytest.approx(mean.tokens * 10 / 29)  # 10 tokens after the first, not the mean's 29


def test_paced_is_a_leaky_bucket_per_replica():
    assert paced(None, 10.0, 3000, 1000.0, 500.0) == pytest.approx(13.0)  # paid off: any prompt, then 3 s of pace
    assert paced(13.0, 12.0, 100, 1000.0, 500.0) is None  # 1 s ahead at 1,000 tokens/s is over a 500-token depth
    assert paced(13.0, 12.6, 100, 1000.0, 500.0) == pytest.approx(13.1)  # 0.4 s ahead: within it
    assert paced(5.0, 12.0, 100, 1000.0, 0.0) == pytest.approx(12.1)  # long paid off: from now, not from then
    assert paced(None, 1.0, 100, None, 0.0) == 1.0  # no pace: always
    with pytest.raises(ValueError):
        paced(None, 0.0, -1, 1000.0, 0.0)


def test_a_paced_gateway_sends_a_replica_prompts_no_faster_than_its_rows_allow():
    clock = FakeClock()
    budget = prefill_budget(SLOW_PREFILL, 0.1, CODE)  # pace 3,000 tokens/s, depth ~830 tokens
    capped = AdmissionCap(LeastOutstanding(), lambda: None, lambda: budget, clock)
    one = [ReplicaLoad("a", "local", "v", 1, 0, 0.0, True)]  # nothing left to prefill: the pending test passes
    sent = 0
    for _ in range(100):  # 10 s, a 1,500-token prompt offered every 0.1 s
        if capped.choose(RouteRequest(prompt_tokens=1500), one) is not None:
            sent += 1500
        clock.advance(0.1)
    assert 3000 * 10 <= sent <= 3000 * 10 + 1500 + budget.tokens  # the pace, plus at most a prompt and the depth
    unpaced = AdmissionCap(LeastOutstanding(), lambda: None, lambda: budget)  # no clock: the pending test alone
    assert all(unpaced.choose(RouteRequest(prompt_tokens=1500), one) for _ in range(10))


def test_a_prompt_the_replica_holds_in_its_prefix_cache_costs_only_its_uncached_tokens():
    request = RouteRequest(prompt_tokens=2000, kv=PrefixMatch(2000, {"a": 1536}, frozenset({"a", "b"})))
    assert uncached_tokens(request, "a") == 464 and uncached_tokens(request, "b") == 2000
    assert uncached_tokens(RouteRequest(prompt_tokens=300), "a") == 300
