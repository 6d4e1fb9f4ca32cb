"""Where replicas run: one Backend interface; local OS processes by default, Ray actors across a
cluster's nodes (`tandem.cluster.ray`, the optional extra `tandem[ray]`), a fake for tests.

Never imports torch, the engine, the model or the optimizers (import-linter contract): a replica is
a process reached over HTTP, described by a ReplicaSpec.
"""

from tandem.cluster.backend import (
    Backend,
    BackendError,
    PendingPlacement,
    Replica,
    ReplicaExit,
    ReplicaSpec,
    ReplicaState,
)
from tandem.cluster.fake import FakeBackend
from tandem.cluster.local import LocalBackend, PortRange, serve_command

__all__ = [
    "Backend",
    "BackendError",
    "FakeBackend",
    "LocalBackend",
    "PendingPlacement",
    "PortRange",
    "Replica",
    "ReplicaExit",
    "ReplicaSpec",
    "ReplicaState",
    "serve_command",
]
