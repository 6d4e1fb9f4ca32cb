"""The scheduling layer: how many replicas, where, and which one serves each request.

Never imports torch, the engine, the model or the optimizers (import-linter contract). It sizes
and routes with `tandem.contracts` types (Profile, ReplicaLoad) and starts replicas through a
`tandem.cluster.Backend`.

- policies/: autoscaling policies, pure functions `(ScaleContext) -> (desired, PolicyState)`
- routers: least-outstanding, power-of-two, region-aware with spill-over, prefix-affinity
- breaker, fallback: a circuit breaker per variant; retry on the fallback before the first byte
- controller: the one impure loop (probe, collect loads, scale, drain before stop); rollout: `use()`
- restarts: backoff after replicas fail to start, and when a variant gives up
- traffic: replicas' own load reports merged with the gateway's in-flight counts; token demand
- dispatch: the per-request side the gateway calls (pick a replica, account for outcomes, fall back)
"""

from tandem.schedule.breaker import BreakerBoard, BreakerConfig, BreakerMode, BreakerState, Outcome
from tandem.schedule.controller import Controller, ControllerConfig, Pool, Snapshot, TickReport
from tandem.schedule.dispatch import Dispatcher, Target
from tandem.schedule.fallback import FailureKind, FallbackPlan, after_failure, breaker_outcome
from tandem.schedule.metrics import SchedulerMetrics
from tandem.schedule.policies import (
    CapacityParams,
    HpaParams,
    KpaParams,
    Policy,
    PolicyState,
    ScaleContext,
    ScaleLimits,
    TokenDemand,
    make_policy,
)
from tandem.schedule.restarts import StartHistory
from tandem.schedule.rollout import Phase, Rollout
from tandem.schedule.routers import (
    LeastOutstanding,
    PowerOfTwo,
    PrefixAffinity,
    RegionAware,
    Router,
    RouteRequest,
    make_router,
)
from tandem.schedule.traffic import DemandMeter, InFlight, LoadReport, estimate
from tandem.schedule.variant import Variant

__all__ = [
    "BreakerBoard",
    "BreakerConfig",
    "BreakerMode",
    "BreakerState",
    "CapacityParams",
    "Controller",
    "ControllerConfig",
    "DemandMeter",
    "Dispatcher",
    "FailureKind",
    "FallbackPlan",
    "HpaParams",
    "InFlight",
    "KpaParams",
    "LoadReport",
    "LeastOutstanding",
    "Outcome",
    "Phase",
    "Policy",
    "PolicyState",
    "Pool",
    "PowerOfTwo",
    "PrefixAffinity",
    "RegionAware",
    "Rollout",
    "RouteRequest",
    "Router",
    "ScaleContext",
    "ScaleLimits",
    "SchedulerMetrics",
    "Snapshot",
    "StartHistory",
    "Target",
    "TickReport",
    "TokenDemand",
    "Variant",
    "after_failure",
    "breaker_outcome",
    "estimate",
    "make_policy",
    "make_router",
]
