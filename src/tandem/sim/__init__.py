"""A discrete-time simulator that drives the real scheduling code (policies, routers, controller) on a
virtual clock, with replicas that serve at a Profile's measured speeds. No torch, no processes."""

from tandem.sim.replica import SimReplica, SimSequence
from tandem.sim.simulator import SimConfig, SimResult, simulate
from tandem.sim.trace import TraceRequest, compress, default_trace_path, load_trace, poisson_trace

__all__ = [
    "SimConfig",
    "SimReplica",
    "SimResult",
    "SimSequence",
    "TraceRequest",
    "compress",
    "default_trace_path",
    "load_trace",
    "poisson_trace",
    "simulate",
]
