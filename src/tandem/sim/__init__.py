"""A discrete-event simulator that drives the real scheduling code (policies, routers, controller) on a
virtual clock, with replicas that serve at a Profile's measured speeds. No torch, no processes.
`tandem sim` (sim/cli.py) runs a trace through every (variant, policy) pair and prices it."""

from tandem.sim.replica import SimReplica, SimSequence
from tandem.sim.simulator import SimConfig, SimResult, simulate
from tandem.sim.trace import (
    TraceRequest,
    bursty_trace,
    compress,
    default_trace_path,
    fit_context,
    load_trace,
    poisson_trace,
)

__all__ = [
    "SimConfig",
    "SimReplica",
    "SimResult",
    "SimSequence",
    "TraceRequest",
    "bursty_trace",
    "compress",
    "default_trace_path",
    "fit_context",
    "load_trace",
    "poisson_trace",
    "simulate",
]
