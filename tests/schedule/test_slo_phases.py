"""Per-phase sizing at the SLO (slo_capacity on a length mix), on hand-made cases.

The profile decodes 25 tokens/s per sequence at any batch up to 16 (an iteration takes 40 ms) and
prefills 10,000 prompt tokens/s; chunked prefill takes 512 prompt tokens per iteration.
"""

from __future__ import annotations

import pytest

from tandem.schedule.policies import TokenDemand, slo_capacity
from tandem.schedule.policies.prefill_budget import admission

from .helpers import profile

FLAT = profile({1: 25.0, 16: 400.0}, prefill=10_000.0)
SLOW_PREFILL = profile({1: 25.0, 16: 400.0}, prefill=5_000.0)


def test_a_long_context_mix_is_tpot_bound():
    # 6,000-token prompts, 100-token answers at 5,000 prefill tokens/s: 60 prompt tokens per output token, 12 ms
    # of prefill per row and iteration, so an iteration at batch n takes 0.04 + 0.012 n s: batch 5 is the last
    # within 100 ms. Its prompts (3,000 tokens/s) keep the prefill 83% busy: a 10 s sojourn, within 100 s.
    cap = slo_capacity(SLOW_PREFILL, 0.1, 60.0, 6100, prompt_tokens=6000, ttft_budget_s=100.0)
    assert (cap.batch, cap.bound) == (5, "tpot")
    assert cap.iteration_s == pytest.approx(0.1)
    assert cap.prompt_tokens_per_s == pytest.approx(60 * 5 / 0.1)  # 3,000: the replica's prefill at the SLO
    assert cap.admit == 6  # the running cap: the batch and the prompt prefilling beside it


def test_a_burst_of_long_prompts_with_short_answers_is_ttft_bound():
    # 2,000-token prompts, 20-token answers: TPOT alone allows batch 6 (0.04 + 0.01 x 6 = 0.1 s) ...
    assert slo_capacity(FLAT, 0.1, 100.0, 2020, prompt_tokens=2000).batch == 6
    # ... but a prompt prefills at 512 / (0.04 + 0.0512) = 5,614 tokens/s beside the rows, and the prompts
    # batch n brings in keep the prefill busy 100 n / (0.04 + 0.01 n) / 5,614 of the time: at batch 4 that
    # is 89%, an M/M/1 sojourn of 0.356 s / 0.11 = 3.3 s; at batch 3, 76% and 1.5 s. A 2 s budget: batch 3.
    cap = slo_capacity(FLAT, 0.1, 100.0, 2020, prompt_tokens=2000, ttft_budget_s=2.0)
    assert (cap.batch, cap.bound) == (3, "ttft")
    assert slo_capacity(FLAT, 0.1, 100.0, 2020, prompt_tokens=2000, ttft_budget_s=4.0).batch == 4


def test_without_a_mix_only_decode_and_the_slots_count():
    cap = slo_capacity(FLAT, 0.1)
    assert (cap.batch, cap.bound, cap.output_tokens_per_s) == (16, "slots", 400.0)


def test_the_admission_cap_follows_the_live_mix():
    long_mix = TokenDemand(prompt_tokens_per_s=6000.0, output_tokens_per_s=100.0, requests_per_s=1.0)
    chat = TokenDemand(prompt_tokens_per_s=100.0, output_tokens_per_s=100.0, requests_per_s=1.0)
    assert admission(SLOW_PREFILL, 0.1, long_mix)[0] == 6
    assert admission(FLAT, 0.1, chat)[0] == 17  # short prompts: every slot, plus one prefilling
    assert admission(FLAT, 0.1, TokenDemand())[0] is None  # nothing finished yet: no cap
