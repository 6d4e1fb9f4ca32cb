"""The oracle policy looks its schedule up a cold start ahead."""

from __future__ import annotations

import pytest

from tandem.schedule.policies import OracleParams, PolicyState, ScaleContext, ScaleLimits, oracle

PARAMS = OracleParams(starts=(0.0, 10.0, 20.0, 30.0), replicas=(1, 7, 2, 1), lookahead_s=12.0)
WIDE = ScaleLimits(min_replicas=1, max_replicas=100, max_scale_up_rate=1000, max_scale_down_rate=1e9)


@pytest.mark.parametrize("now, desired", [(0.0, 7), (15.0, 7), (25.0, 2), (35.0, 1), (99.0, 1)])
def test_the_most_the_windows_ahead_need(now, desired):
    ctx = ScaleContext(now, "v", 3, 3, (), WIDE, PolicyState())
    assert oracle(ctx, PARAMS)[0] == desired


def test_a_schedule_out_of_order_is_refused():
    with pytest.raises(ValueError, match="ascending"):
        OracleParams(starts=(10.0, 0.0), replicas=(1, 2))
