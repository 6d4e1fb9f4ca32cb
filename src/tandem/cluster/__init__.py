"""Where replicas run: one Backend interface; local OS processes by default, a fake for tests.

Never imports torch, the engine, the model or the optimizers (import-linter contract): a replica is
a process reached over HTTP, described by a ReplicaSpec.
"""

from tandem.cluster.backend import Backend, BackendError, Replica, ReplicaExit, ReplicaSpec, ReplicaState
from tandem.cluster.fake import FakeBackend
from tandem.cluster.local import LocalBackend, PortRange, serve_command

__all__ = [
    "Backend",
    "BackendError",
    "FakeBackend",
    "LocalBackend",
    "PortRange",
    "Replica",
    "ReplicaExit",
    "ReplicaSpec",
    "ReplicaState",
    "serve_command",
]
