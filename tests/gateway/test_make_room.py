"""Making room across models (FakeBackend with a memory budget, a fake clock): a model a request waits
for, whose replica waits for room, gets it from an idle model scaled down by its own controller."""

from __future__ import annotations

import httpx

from tandem.cluster.backend import ReplicaState
from tandem.cluster.fake import FakeBackend
from tandem.deployment.fleet_file import parse_fleet
from tandem.gateway.make_room import RoomMaker
from tandem.gateway.models import build_fleet_gateway


def _fleet(code_min: int = 0):
    clock = [0.0]
    one = lambda lo: [{"name": "base", "recipe": "baseline", "replicas": {"min": lo, "max": 1}}]  # noqa: E731
    raw = {"policy": {"name": "kpa"}, "models": [{"name": "code", "variants": one(code_min)},
                                                 {"name": "chat", "variants": one(0)}]}  # fmt: skip
    backend = FakeBackend(clock=lambda: clock[0], memory_bytes=1 << 30)  # room for one bundled replica
    gw = build_fleet_gateway(parse_fleet(raw), backend, clock=lambda: clock[0], transport=httpx.MockTransport(
        lambda r: httpx.Response(200)))  # fmt: skip
    return gw, clock


def _tick(gw, room, clock, times=1):
    """What the control loop does each tick: make room, then every model's own tick."""
    for _ in range(times):
        room.tick(gw, clock[0])
        for part in gw.parts():
            part.fleet.controller.tick()


def _ready(part) -> int:
    return sum(1 for r in part.fleet.backend.list() if r.state is ReplicaState.READY)


def test_an_idle_model_is_scaled_down_for_one_a_request_waits_for():
    gw, clock = _fleet()
    code, chat = gw.models["code"], gw.models["chat"]
    room = RoomMaker(min_idle_s=10.0)
    code.fleet.inflight.buffered["base"] = 1  # code's first request starts its replica
    _tick(gw, room, clock, 2)
    del code.fleet.inflight.buffered["base"]
    assert _ready(code) == 1
    clock[0] += 5.0
    chat.fleet.inflight.buffered["base"] = 1  # now chat's: its replica waits for room
    _tick(gw, room, clock, 2)
    (waiting,) = chat.fleet.backend.list()
    assert waiting.pending is not None and waiting.pending.cause == "no-room"
    assert "no room: needs" in waiting.pending.reason and _ready(code) == 1  # code was busy 5 s ago: kept
    clock[0] += 10.0
    _tick(gw, room, clock, 4)  # code idle 15 s: capped at 0, drained, stopped; chat's replica placed, ready
    assert code.fleet.backend.list() == [] and _ready(chat) == 1
    assert room.held  # code stays capped while idle, so its policy does not take the room back
    code.fleet.inflight.buffered["base"] = 1  # a request for code: the cap is lifted, its replica waits for room
    _tick(gw, room, clock)
    assert not room.held and code.fleet.backend.list()[0].pending is not None


def test_a_model_at_its_min_is_never_scaled_down_for_another():
    gw, clock = _fleet(code_min=1)
    code, chat = gw.models["code"], gw.models["chat"]
    room = RoomMaker(min_idle_s=0.0)
    _tick(gw, room, clock, 2)
    chat.fleet.inflight.buffered["base"] = 1
    clock[0] += 100.0
    _tick(gw, room, clock, 3)
    assert _ready(code) == 1 and not room.held
    (waiting,) = chat.fleet.backend.list()
    assert waiting.pending is not None  # it waits, with its reason, rather than take code below its min
