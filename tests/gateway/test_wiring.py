"""The gateway's wiring: named pieces (fleet, dispatcher, upstream, observer), where replica logs go."""

from __future__ import annotations

from pathlib import Path

from tandem.cluster.fake import FakeBackend
from tandem.deployment import parse_deployment
from tandem.gateway.observers import NO_OBSERVER
from tandem.gateway.shadow import GatewayShadow
from tandem.gateway.wiring import build_gateway, default_log_dir

VARIANTS = [{"name": "a", "replicas": {"min": 1, "max": 2}}, {"name": "b", "recipe": "int8", "replicas": {"max": 1}}]


def test_the_gateway_is_made_of_named_pieces_sharing_one_backend_and_clock():
    backend = FakeBackend(clock=lambda: 0.0)
    gw = build_gateway(
        parse_deployment({"variants": VARIANTS, "policy": {"name": "hpa"}}), backend, clock=lambda: 5.0,
        first_byte_timeout_s=3.0, stream_idle_timeout_s=4.0, fleet_secret="s" * 32, buffer_timeout_s=7.0,
        max_resumes=5,
    )  # fmt: skip
    assert gw.fleet.backend is backend and gw.dispatcher.backend is backend
    assert gw.fleet.controller.primary == "a" and set(gw.fleet.variants) == {"a", "b"}
    assert (gw.upstream.first_byte_timeout_s, gw.upstream.stream_idle_timeout_s) == (3.0, 4.0)
    assert gw.upstream.max_resumes == 5  # --max-resumes (tandem.gateway.cli)
    assert gw.upstream.fleet_secret == "s" * 32 and gw.upstream.client is None  # opened on the event loop
    assert gw.buffer_timeout_s == 7.0 and gw.clock() == 5.0
    assert gw.shadow is None and gw.observer is NO_OBSERVER  # nothing observes requests without a gate


def test_a_gate_makes_the_shadow_the_requests_observer():
    raw = {"variants": VARIANTS, "policy": {"name": "hpa"}, "gate": {"candidate": "b"}}
    gw = build_gateway(parse_deployment(raw), FakeBackend(clock=lambda: 0.0), clock=lambda: 0.0)
    assert isinstance(gw.shadow, GatewayShadow) and gw.shadow in gw.observer.observers


def test_logs_go_to_one_folder_per_gateway_run_under_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path))
    folder = default_log_dir(now=lambda: 0.0)
    assert folder.parent == Path(tmp_path) / "logs" and folder.name.startswith("gateway-")
