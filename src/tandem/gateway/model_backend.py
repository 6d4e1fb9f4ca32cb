"""One backend shared by every model of the fleet, seen by each model as a Backend of its own.

Every model has its own Controller and Dispatcher, as one model had; they must see only their
model's replicas (probe, drain, stop, count, route) and each hear of their own replicas' exits.
`SharedBackend.view(model)` is that Backend: what it starts is recorded as the model's, `list()`
shows the model's alone, and `exits()` hands each model the exits of its own replicas (the shared
backend reports each exit once; the views sort them). The backend and the scheduling layer never
learn what a model is: it is a name the gateway keeps beside each replica id.

Anything else a test or a view of the whole machine reaches for (LocalBackend.pid, Ray's placer)
is the shared backend's, through the view.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

from tandem.cluster.backend import Backend, Replica, ReplicaExit, ReplicaSpec

__all__ = ["ModelBackend", "SharedBackend", "shared_backend"]


class SharedBackend:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.owner: dict[str, str] = {}  # replica id -> the model that started it
        self._exits: defaultdict[str, list[ReplicaExit]] = defaultdict(list)
        self._lock = threading.Lock()

    def view(self, model: str) -> ModelBackend:
        return ModelBackend(self, model)

    def model_of(self, replica_id: str) -> str | None:
        return self.owner.get(replica_id)

    def started(self, replica: Replica, model: str) -> None:
        with self._lock:
            self.owner[replica.replica_id] = model

    def exits_of(self, model: str) -> list[ReplicaExit]:
        with self._lock:
            for ex in self.backend.exits():
                owner = self.owner.pop(ex.replica.replica_id, None)
                if owner is not None:
                    self._exits[owner].append(ex)
            return self._exits.pop(model, [])

    def list_of(self, model: str) -> list[Replica]:
        return [r for r in self.backend.list() if self.owner.get(r.replica_id) == model]


class ModelBackend:
    """The shared backend as one model sees it (a Backend)."""

    def __init__(self, shared: SharedBackend, model: str) -> None:
        self.shared, self.model = shared, model

    def start(self, spec: ReplicaSpec) -> Replica:
        replica = self.shared.backend.start(spec)
        self.shared.started(replica, self.model)
        return replica

    def drain(self, replica_id: str) -> None:
        self.shared.backend.drain(replica_id)

    def stop(self, replica_id: str) -> None:
        self.shared.backend.stop(replica_id)

    def list(self) -> list[Replica]:
        return self.shared.list_of(self.model)

    def health(self, replica_id: str) -> bool:
        return self.shared.backend.health(replica_id)

    def exits(self) -> list[ReplicaExit]:
        return self.shared.exits_of(self.model)

    def __getattr__(self, name: str) -> Any:  # pid(), stopping, placer...: the machine's
        return getattr(self.shared.backend, name)


def shared_backend(backend: Backend) -> Backend:
    """The backend under a model's view (itself where there is no view: one model)."""
    return backend.shared.backend if isinstance(backend, ModelBackend) else backend
