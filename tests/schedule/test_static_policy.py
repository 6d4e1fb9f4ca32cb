"""`static-peak`: a fixed count, held whatever the traffic; the limits still apply."""

import pytest

from tandem.schedule.policies import PolicyState, ScaleContext, ScaleLimits, StaticParams, make_policy

from .helpers import spread


def decide(current: int, in_flight: int, replicas: int, limits=ScaleLimits(0, 100)) -> int:
    ctx = ScaleContext(0.0, "v", current, current, spread(in_flight, max(current, 1)), limits, PolicyState())
    return make_policy("static-peak", StaticParams(replicas))(ctx)[0]


@pytest.mark.parametrize("in_flight", [0, 5, 500])
def test_the_count_is_held_whatever_the_load(in_flight):
    assert decide(current=6, in_flight=in_flight, replicas=6) == 6


def test_a_fleet_below_the_count_comes_up_to_it_and_limits_still_bound_it():
    assert decide(current=1, in_flight=0, replicas=6) == 6
    assert decide(current=1, in_flight=0, replicas=6, limits=ScaleLimits(0, 4)) == 4


def test_a_negative_count_is_refused():
    with pytest.raises(ValueError, match="replicas >= 0"):
        StaticParams(-1)
