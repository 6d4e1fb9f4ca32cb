"""Headroom from the traffic's burstiness (a work-weighted quantile of its peaks) and its slow feedback."""

from __future__ import annotations

import math

import pytest

from tandem.schedule.policies.headroom import FeedbackGains, attainment_window, burst_need, feedback, headroom


def test_a_burst_needs_what_the_queue_cannot_absorb():
    assert burst_need(10.0, 10.0, 5.0) == pytest.approx(10 * 10 / 15)  # 10x for 10 s, 5 s of queueing allowed
    assert burst_need(0.5, 10.0, 5.0) == 1.0  # a lull needs the mean, never less
    assert burst_need(3.0, 10.0, 0.0) == 3.0  # no queueing: the peak itself


def test_the_headroom_quantile_weighs_peaks_by_their_work():
    # 90% of the work came at the mean, 10% in a burst needing 5x: rare in time, but a 95% quantile of the
    # requests must absorb it; a 90% quantile need not.
    peaks = ((0.0, 1.0, 9.0), (10.0, 5.0, 1.0))
    assert headroom(peaks, 0.90) == 1.0
    assert headroom(peaks, 0.95) == 5.0
    assert headroom((), 0.99) == 1.0
    with pytest.raises(ValueError, match="quantile"):
        headroom(peaks, 0.0)


def test_feedback_raises_the_gain_under_target_and_lowers_it_when_comfortable():
    gains = FeedbackGains(target=0.99, comfort=0.5, raise_time_s=600, lower_time_s=900, gain_min=0.8, gain_max=1.5)
    assert feedback(1.0, 0.95, 60.0, gains) == pytest.approx(math.exp(60 / 600))  # under target: up
    assert feedback(1.0, 0.999, 60.0, gains) == pytest.approx(math.exp(-60 / 900))  # above 99.5%: down
    assert feedback(1.0, 0.993, 60.0, gains) == 1.0  # on target: left alone
    assert feedback(1.0, None, 60.0, gains) == 1.0  # nothing finished: nothing learned
    assert feedback(1.45, 0.5, 600.0, gains) == 1.5  # within its bounds
    assert feedback(0.81, 1.0, 600.0, gains) == 0.8


def test_the_attainment_window_decays_old_requests():
    gains = FeedbackGains(window_s=300.0)
    good, total = attainment_window((0.0, 0.0), 0.5, 10.0, 2.0, gains)  # 20 requests, 10 within the SLO
    assert (good, total) == (10.0, 20.0)
    good, total = attainment_window((good, total), 1.0, 10.0, 300.0, gains)  # 3,000 more, all within
    assert good / total > 0.99 and total == pytest.approx(20 / math.e + 3000)
