"""The lifeline: a replica notices that the gateway which started it is gone (its parent changed)."""

from __future__ import annotations

import threading

from tandem.edge.lifeline import orphaned, watch_parent


def test_orphaned_once_the_parent_pid_changes():
    assert not orphaned(100, getppid=lambda: 100)
    assert orphaned(100, getppid=lambda: 1)  # re-parented to init (or a subreaper)


def test_the_watcher_calls_back_once_when_the_parent_goes():
    parents = iter([100, 100, 1, 1, 1])
    called = threading.Event()
    calls = []

    def on_orphaned() -> None:
        calls.append(1)
        called.set()

    thread = watch_parent(100, on_orphaned, interval_s=0.001, getppid=lambda: next(parents))
    assert called.wait(10)
    thread.join(10)
    assert calls == [1] and not thread.is_alive()
