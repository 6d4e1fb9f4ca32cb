"""The Backend interface: where replicas run. One Protocol, several homes (local processes, a fake, Ray).

A replica goes STARTING -> READY (its health probe answered) -> DRAINING (no new requests are routed
to it; it finishes what it has) -> STOPPED. The scheduling layer decides *when*; a backend only does
what it is told and reports what it sees. Backends know nothing of policies, routers or engines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Protocol, runtime_checkable

from tandem.cluster.external import ExternalEngine

__all__ = [
    "Backend",
    "BackendError",
    "PendingPlacement",
    "Replica",
    "ReplicaExit",
    "ReplicaSpec",
    "ReplicaState",
    "summarize_output",
]


class BackendError(RuntimeError):
    """A backend could not do what it was asked (no such replica, a process that would not start).

    `replica_id`: the replica a failed `start` had named, where it got that far."""

    def __init__(self, message: str, *, replica_id: str | None = None) -> None:
        super().__init__(message)
        self.replica_id = replica_id


class ReplicaState(StrEnum):
    STARTING = "starting"  # launched, not answering its readiness probe yet
    READY = "ready"  # routable
    DRAINING = "draining"  # finishing its in-flight requests; routers skip it
    STOPPED = "stopped"  # terminated or exited; kept only until the backend forgets it


@dataclass(frozen=True)
class ReplicaSpec:
    """How to start one replica of a variant: what `tandem serve` needs, minus the port.

    `recipe` is text the replica validates itself; None serves the replica's default recipe.
    `model` None serves the bundled default model. `threads` is torch threads per replica (None:
    the server's default). `extra_args` are appended to the server's command line verbatim.
    `memory_bytes` is what the replica needs of its node's memory budget (0: not counted; see
    tandem.cluster.room): every backend places by it. `accelerators` and `accelerator_type` are what
    a backend that places replicas on nodes (Ray) reserves for it; local processes ignore them.
    `engine`, when set, is an external server to run instead of `tandem serve` (recipe and
    extra_args then unused): its command template, readiness path and metrics (tandem.cluster.external).
    """

    variant: str
    recipe: str | None
    model: str | None = None
    region: str = "local"
    threads: int | None = None
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    memory_bytes: int = 0
    accelerators: float = 0.0
    accelerator_type: str | None = None
    engine: ExternalEngine | None = None

    @property
    def ready_path(self) -> str:
        """The path a backend probes: tandem's GET /ready, or the external engine's own."""
        return self.engine.ready_path if self.engine is not None else "/ready"

    def __post_init__(self) -> None:
        if not self.variant:
            raise ValueError("ReplicaSpec.variant must not be empty")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"ReplicaSpec.threads must be >= 1 (got {self.threads})")
        if self.memory_bytes < 0 or self.accelerators < 0:
            raise ValueError("ReplicaSpec.memory_bytes and accelerators must be >= 0")


@dataclass(frozen=True)
class PendingPlacement:
    """Why a replica is not running anywhere yet: no node's memory holds it now, or ever (tandem.cluster.room), or
    Ray has not placed it (tandem.cluster.ray.demand).

    `cause` is one of CAUSES (a bounded label for metrics); `detail` says it for an operator.
    """

    cause: str
    detail: str

    CAUSES: ClassVar[tuple[str, ...]] = ("no-room", "too-large", "no-node-in-region")

    def __post_init__(self) -> None:
        if self.cause not in self.CAUSES:
            raise ValueError(f"unknown pending cause {self.cause!r} (known: {', '.join(self.CAUSES)})")

    def __str__(self) -> str:
        return f"pending ({self.cause}): {self.detail}"

    @property
    def reason(self) -> str:
        """One line for an operator: 'no room: needs 412 MiB, free 128 MiB on node local'."""
        return f"{self.cause.replace('-', ' ')}: {self.detail}"


@dataclass(frozen=True)
class Replica:
    """A backend's snapshot of one replica."""

    replica_id: str
    spec: ReplicaSpec
    state: ReplicaState
    url: str = ""  # base URL of its HTTP endpoint ("http://127.0.0.1:PORT"); "" where there is none
    started_at: float = 0.0  # on the backend's clock
    exit_code: int | None = None
    node: str = ""  # the node it runs on, where the backend has several (a Ray node id); "" otherwise
    pending: PendingPlacement | None = None  # STARTING but placed nowhere yet, and why

    @property
    def variant(self) -> str:
        return self.spec.variant

    @property
    def region(self) -> str:
        return self.spec.region

    @property
    def live(self) -> bool:
        """Counts toward the fleet: starting or ready (a draining replica is on its way out)."""
        return self.state in (ReplicaState.STARTING, ReplicaState.READY)


# A logged error ("... ERROR tandem.serve: ..."), click's "Error: ...", a traceback's last line.
_ERROR_LINE = re.compile(r" ERROR |^Error: |^[\w.]*(Error|Exception): ")


def summarize_output(output: str) -> str:
    """The line of a replica's output that says why it failed: its last error line, else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return next((line for line in reversed(lines) if _ERROR_LINE.search(line)), lines[-1] if lines else "")


@dataclass(frozen=True)
class ReplicaExit:
    """A replica whose process ended, reported once by `Backend.exits()`."""

    replica: Replica  # as it was last seen: its state then (STARTING: it never became ready)
    code: int | None  # exit status (negative: killed by that signal); None where unknown
    expected: bool  # the backend was asked to stop it
    output: str = ""  # the end of what it wrote (stdout and stderr), for logs and operators

    @property
    def error(self) -> str:
        return summarize_output(self.output)


@runtime_checkable
class Backend(Protocol):
    """Start, drain, stop, list and probe replicas. Calls return at once; none waits for a process."""

    def start(self, spec: ReplicaSpec) -> Replica:
        """Launch a replica; it is STARTING until `health` sees it ready."""
        ...

    def drain(self, replica_id: str) -> None:
        """Mark it DRAINING: routers stop sending it requests; it finishes the ones it has."""
        ...

    def stop(self, replica_id: str) -> None:
        """Terminate it gracefully (a server finishes in-flight work on SIGTERM); it leaves `list()`."""
        ...

    def list(self) -> list[Replica]:
        """Replicas not yet stopped (STARTING, READY, DRAINING), oldest first."""
        ...

    def health(self, replica_id: str) -> bool:
        """Probe it: True when it answers ready. A STARTING replica that answers becomes READY."""
        ...

    def exits(self) -> list[ReplicaExit]:
        """Replicas whose processes ended since the last call, each reported once, oldest first."""
        ...
