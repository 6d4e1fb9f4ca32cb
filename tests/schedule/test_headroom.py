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


def test_by_default_the_feedback_only_adds_room_it_never_undercuts_the_model():
    # a gain below 1 took the forecast's own replicas away on a small fleet (mooncake: 4 replicas -> 3, a queue)
    assert feedback(1.3, 1.0, 3600.0) == 1.0 and feedback(1.0, 0.5, 60.0) > 1.0


def test_the_attainment_window_decays_old_requests():
    gains = FeedbackGains(window_s=300.0)
    good, total = attainment_window((0.0, 0.0), 0.5, 10.0, 2.0, gains)  # 20 requests, 10 within the SLO
    assert (good, total) == (10.0, 20.0)
    good, total = attainment_window((good, total), 1.0, 10.0, 300.0, gains)  # 3,000 more, all within
    assert good / total > 0.99 and total == pytest.approx(20 / math.e + 3000)


def test_the_shortfall_windows_double_up_to_the_reaction_time():
    from tandem.schedule.policies.headroom import peak_windows

    assert peak_windows(10.0, 96.0) == (10.0, 20.0, 40.0, 80.0)
    assert peak_windows(10.0, 5.0) == (10.0,)


def test_the_shortfall_is_what_arrived_against_what_was_forecast_a_cold_start_before():
    from tandem.schedule.policies.headroom import shortfall_need

    now, horizon = 200.0, 60.0
    forecasts = tuple((float(t), 2.0) for t in range(0, 200, 2))  # the fleet was sized for 2 replicas' work
    # The last 40 s brought 4 replicas' work (samples are 10 s windows: the last 30 s of them cover 40 s).
    samples = tuple((float(t), 4.0 if t >= 160 else 2.0) for t in range(0, 201, 2))
    windows = (10.0, 20.0, 40.0, 80.0)
    need = shortfall_need(samples, forecasts, now, horizon, windows, delay_s=4.0, sample_window_s=10.0)
    # 4 replicas' work for 40 s, a queue absorbing 4 s of it, needs 4 x 40 / 44 = 3.6 replicas: 1.6 more than
    # forecast (the 80 s window, 3.2 on average, needs 3.0; the 10 s one 2.9)
    assert need == pytest.approx(4 * 40 / 44 - 2)
    # A forecast made on too little traffic (NaN) is not judged, nor is any window it sized.
    blind = tuple((t, math.nan if t > 110 else f) for t, f in forecasts)
    assert shortfall_need(samples, blind, now, horizon, windows, 4.0, 10.0) is None
    # Forecasts that do not reach back a cold start: nothing to judge yet.
    assert shortfall_need(samples, forecasts[-20:], now, horizon, windows, 4.0, 10.0) is None
    # A forecast that was enough is no shortfall (never below 0).
    assert shortfall_need(samples, tuple((t, 5.0) for t, _ in forecasts), now, horizon, windows, 4.0, 10.0) == 0.0


def test_the_headroom_of_shortfalls_in_replicas_is_at_least_zero():
    assert headroom((), 0.99, least=0.0) == 0.0
    assert headroom(((0.0, 0.0, 9.0), (10.0, 3.0, 1.0)), 0.95, least=0.0) == 3.0
