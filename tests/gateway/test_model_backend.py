"""One backend shared by every model, each model's view showing its own replicas and exits alone."""

from __future__ import annotations

from tandem.cluster.backend import ReplicaSpec
from tandem.cluster.fake import FakeBackend
from tandem.gateway.model_backend import SharedBackend, shared_backend


def test_each_view_lists_probes_and_hears_of_its_own_replicas_alone():
    fake = FakeBackend(clock=lambda: 0.0)
    shared = SharedBackend(fake)
    code, chat = shared.view("code"), shared.view("chat")
    a = code.start(ReplicaSpec("base", "baseline"))
    b = chat.start(ReplicaSpec("base", "baseline"))  # the same variant name in another model
    assert a.replica_id != b.replica_id
    assert [r.replica_id for r in code.list()] == [a.replica_id]
    assert [r.replica_id for r in chat.list()] == [b.replica_id]
    assert code.health(a.replica_id) and shared.model_of(b.replica_id) == "chat"
    fake.crash(b.replica_id)
    code.stop(a.replica_id)
    assert [e.replica.replica_id for e in code.exits()] == [a.replica_id]  # chat's exit is kept for chat
    (gone,) = chat.exits()
    assert gone.replica.replica_id == b.replica_id and not gone.expected
    assert code.exits() == [] and chat.exits() == []  # each reported once
    assert shared_backend(code) is fake and shared_backend(fake) is fake
    assert code.calls is fake.calls  # what tests reach for is the machine's
