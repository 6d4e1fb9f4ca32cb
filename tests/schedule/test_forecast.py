"""The capacity policy's forecasts: Holt's smoothing on time constants, and the burst rate of an arrival curve."""

import math

import pytest

from tandem.schedule.policies.forecast import burst_rate, holt


def test_holt_weighs_by_time_not_by_tick():
    # One tick of 10 s and ten ticks of 1 s move the level the same way towards a constant.
    one, _ = holt(0.0, 0.0, 0.0, 100.0, 10.0, level_time_s=10.0, trend_time_s=1e9)
    level, trend, at = 0.0, 0.0, 0.0
    for t in range(1, 11):
        level, trend = holt(level, trend, at, 100.0, float(t), level_time_s=10.0, trend_time_s=1e9)
        at = float(t)
    assert one == pytest.approx(100 * (1 - math.exp(-1)))
    assert level == pytest.approx(one, rel=1e-6)


def test_holt_learns_a_ramp():
    level, trend, at = None, 0.0, None
    for t in range(0, 300, 2):
        level, trend = holt(level, trend, at, 5.0 * t, float(t), level_time_s=5.0, trend_time_s=30.0)
        at = float(t)
    assert trend == pytest.approx(5.0, rel=0.05)


def test_no_time_constant_is_no_smoothing():
    assert holt(10.0, 0.0, 0.0, 50.0, 2.0, 0.0, 0.0) == (50.0, 20.0)


def test_a_steady_rate_needs_that_rate():
    samples = tuple((float(t), 4.0) for t in range(0, 120, 2))
    assert burst_rate(samples, delay_s=1.0, shortest_s=2.0) == pytest.approx(4.0 * 118 / 119)


def test_a_short_burst_needs_less_than_its_peak_when_the_queue_may_absorb_it():
    # 1 replica of work, with 10 s at 10 replicas: the queue may hold work for 5 s.
    samples = tuple((float(t), 10.0 if 60 < t <= 70 else 1.0) for t in range(0, 180, 1))
    rate = burst_rate(samples, delay_s=5.0, shortest_s=1.0)
    # The whole burst over its length plus the delay: 10 s x 10 / (10 s + 5 s) = 6.7 (the doubling windows
    # come within 8 s x 10 / 13 s = 6.15 of it): between the mean and the peak.
    assert 6.1 < rate < 6.7
    assert burst_rate(samples, delay_s=0.1, shortest_s=1.0) > 9.5  # no room to queue: the peak itself


def test_no_samples_no_rate():
    assert burst_rate((), 1.0, 1.0) == 0.0 and burst_rate(((0.0, 3.0),), 1.0, 1.0) == 3.0


def test_the_robust_line_ignores_a_short_burst_and_gives_the_level_now():
    from tandem.schedule.policies.forecast import robust_line

    flat = tuple((float(t), 10.0 * (5 if 60 <= t < 70 else 1)) for t in range(0, 120, 2))  # a 10 s burst at 5x
    level, slope = robust_line(flat, 118.0)
    assert level == pytest.approx(10.0) and slope == pytest.approx(0.0)
    ramp = tuple((float(t), 2.0 + 0.5 * t) for t in range(0, 120, 2))  # a minute's median would say 32
    level, slope = robust_line(ramp, 118.0)
    assert level == pytest.approx(61.0) and slope == pytest.approx(0.5)
    assert robust_line((), 0.0) == (0.0, 0.0)
    assert robust_line(((3.0, 7.0),), 5.0) == (7.0, 0.0)
