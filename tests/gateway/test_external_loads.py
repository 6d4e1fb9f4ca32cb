"""Polling external engines' loads (tandem.gateway.loads) on a mock transport: the metrics adapter's
report with its source, the in-flight fallback when there are no metrics, and revival either way."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import httpx

from tandem.cluster.backend import Replica, ReplicaSpec, ReplicaState
from tandem.cluster.external import ExternalEngine
from tandem.gateway.loads import poll_loads
from tandem.schedule.traffic import InFlight

VLLM_TEXT = (Path(__file__).parents[1] / "fixtures" / "metrics" / "vllm.txt").read_text()


def replica(name: str, adapter: str, port: int) -> Replica:
    engine = ExternalEngine(command=("srv",), ready_path="/ping", metrics_adapter=adapter, metrics_path="/prom")
    return Replica(name, ReplicaSpec(name, None, engine=engine), ReplicaState.READY, url=f"http://h:{port}")


class Revived:
    def __init__(self) -> None:
        self.revived: list[str] = []

    def revive(self, replica_id: str) -> None:
        self.revived.append(replica_id)

    def forget(self, live) -> None:
        pass


def poll(replicas: list[Replica], handler) -> SimpleNamespace:
    gw = SimpleNamespace(
        fleet=SimpleNamespace(
            backend=SimpleNamespace(list=lambda: replicas), inflight=InFlight(clock=lambda: 0.0), kv=None
        ),
        upstream=SimpleNamespace(liveness=Revived(), load_timeout_s=1.0, client=None),
    )  # fmt: skip

    async def run() -> int:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            gw.upstream.client = client
            return await poll_loads(gw.fleet, gw.upstream)

    gw.answered = asyncio.run(run())
    return gw


def test_metrics_become_a_report_and_no_metrics_leave_the_gateways_counts():
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.url.port}{request.url.path}")
        if request.url.path == "/prom":
            return httpx.Response(200, text=VLLM_TEXT)
        return httpx.Response(200 if request.url.path == "/ping" else 404)

    vllm, plain = replica("gpu-1", "vllm", 1), replica("cpp-1", "none", 2)
    gw = poll([vllm, plain], handler)
    assert sorted(asked) == ["1/prom", "2/ping"] and gw.answered == 2
    report = gw.fleet.inflight.reports["gpu-1"].load
    assert (report.running, report.waiting, report.kv_used, report.source) == (7, 3, 0.4375, "vllm")
    assert "cpp-1" not in gw.fleet.inflight.reports and sorted(gw.upstream.liveness.revived) == ["cpp-1", "gpu-1"]
    gw.fleet.inflight.begin("cpp-1")
    loads = gw.fleet.inflight.loads([vllm, plain])
    assert (loads["cpp-1"].running, loads["cpp-1"].source) == (1, "gateway-inflight")
    assert loads["gpu-1"].source == "vllm"


def test_metrics_the_adapter_cannot_read_fall_back_to_asking_whether_it_answers():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/prom":
            return httpx.Response(200, text="sglang:num_running_reqs 3\n")  # the wrong server for `vllm`
        return httpx.Response(200)

    gw = poll([replica("gpu-1", "vllm", 1)], handler)
    assert gw.answered == 1 and not gw.fleet.inflight.reports and gw.upstream.liveness.revived == ["gpu-1"]


def test_a_replica_that_does_not_answer_is_neither_reported_nor_revived():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    gw = poll([replica("gpu-1", "vllm", 1), replica("cpp-1", "none", 2)], handler)
    assert gw.answered == 0 and not gw.fleet.inflight.reports and gw.upstream.liveness.revived == []
