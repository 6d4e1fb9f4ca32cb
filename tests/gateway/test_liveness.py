"""Deadlines per request: a replica that misses one is declared unresponsive, routing is told, and every
request waiting on it gives up at once; a non-streaming wait asks the replica before giving up."""

from __future__ import annotations

import asyncio

import pytest

from tandem.gateway.liveness import MID_STREAM, Liveness, RequestTimeout, Unresponsive


def test_a_missed_deadline_declares_the_replica_and_frees_everyone_waiting_on_it():
    declared, revived = [], []

    async def main() -> None:
        live = Liveness(on_declare=declared.append, on_revive=revived.append)

        async def wait_on(replica: str, seconds: float) -> str:
            try:
                async with live.deadline(replica, seconds, "first byte"):
                    await asyncio.Event().wait()  # a frozen replica: nothing ever comes
            except Unresponsive as exc:
                return exc.why
            return "answered"

        loop = asyncio.get_running_loop()
        started = loop.time()
        # One request with a short deadline; two with long ones on the same replica, one on another.
        results = await asyncio.gather(
            wait_on("a", 0.05), wait_on("a", 60), wait_on("a", 60), asyncio.wait_for(wait_on("b", 60), 0.3),
            return_exceptions=True,
        )  # fmt: skip
        assert loop.time() - started < 1.0  # the long waits on "a" ended with the short one
        assert results[:3] == ["no first byte within 0.05 s"] * 3
        assert isinstance(results[3], TimeoutError)  # "b" is someone else: still waiting
        assert declared == ["a"] and live.unresponsive == {"a": "no first byte within 0.05 s"}
        with pytest.raises(Unresponsive):  # declared: refused at once until it answers again
            async with live.deadline("a", 60, "first byte"):
                pass
        live.revive("a")
        async with live.deadline("a", 60, "first byte"):
            pass
        assert revived == ["a"]

    asyncio.run(main())


def test_a_block_that_finishes_in_time_or_fails_on_its_own_declares_nothing():
    async def main() -> None:
        live = Liveness()
        async with live.deadline("a", 5, "chunk"):
            await asyncio.sleep(0)
        with pytest.raises(TimeoutError):  # the block's own TimeoutError passes through
            async with live.deadline("a", 5, "chunk"):
                raise TimeoutError
        assert live.unresponsive == {}

    asyncio.run(main())


def test_a_slow_answer_from_a_replica_that_answers_its_health_check_is_awaited():
    probes: list[bool] = []

    async def main() -> None:
        live = Liveness()

        async def probe() -> bool:
            probes.append(True)
            return True

        async def slow() -> str:
            await asyncio.sleep(0.25)
            return "the answer"

        assert await live.answer("a", slow(), 0.05, probe) == "the answer"
        assert len(probes) >= 2 and live.unresponsive == {}

    asyncio.run(main())


def test_a_replica_that_does_not_answer_its_health_check_is_declared_and_the_wait_cancelled():
    cancelled = asyncio.Event()

    async def main() -> None:
        live = Liveness()

        async def never() -> str:
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.set()  # the upstream request is closed, so the replica would abort it
            return "unreachable"

        async def dead() -> bool:
            return False

        with pytest.raises(Unresponsive, match="no answer to GET /health"):
            await live.answer("a", never(), 0.05, dead)
        assert cancelled.is_set() and "a" in live.unresponsive

    asyncio.run(main())


@pytest.mark.slow
def test_a_frozen_replica_loses_no_request_that_had_not_started_streaming(serve_model_dir, tmp_path):
    """SIGSTOP one of two busy replicas: requests waiting on it for a first byte move to the other within
    the deadline; streams already under way end with an error event and `data: [DONE]`; nothing hangs."""
    import os
    import signal
    import threading
    import time

    import httpx

    from .harness import MODEL_NAME, RunningGateway, variant, wait_for

    deadline_s = 3.0
    raw = {
        "model": str(serve_model_dir),
        "threads": 1,
        "variants": [variant("fast", lo=2, hi=2)],
        "policy": {"name": "hpa", "interval_s": 0.5, "params": {"target": 100}},
    }
    gw = RunningGateway(raw, tmp_path / "logs", first_byte_timeout_s=deadline_s, stream_idle_timeout_s=deadline_s)
    frozen: int | None = None
    outcomes: list[tuple[bool, float, float, bool, str]] = []  # stream?, started, seconds, ok, detail
    unfinished: list[str] = []  # streams that did not end with data: [DONE]
    lock, stop = threading.Lock(), threading.Event()

    def client(worker: int) -> None:
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            n = 0
            while not stop.is_set():
                stream, n = (worker + n) % 2 == 0, n + 1
                body = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 48, "stream": stream}
                started = time.monotonic()
                try:
                    if stream:
                        with http.stream("POST", "/v1/completions", json=body) as r:
                            text = "".join(r.iter_text())
                        ok, detail = r.status_code == 200 and '"error"' not in text, text[-300:]
                        if not text.endswith("data: [DONE]\n\n"):  # every stream must, even a broken one
                            unfinished.append(text[-300:])
                    else:
                        r = http.post("/v1/completions", json=body)
                        ok, detail = r.status_code == 200, r.text[:300]
                except httpx.HTTPError as exc:
                    ok, detail = False, repr(exc)
                with lock:
                    outcomes.append((stream, started, time.monotonic() - started, ok, detail))

    try:
        gw.wait_ready("fast", count=2)
        workers = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(6)]
        for w in workers:
            w.start()
        wait_for(lambda: sum(o[3] for o in outcomes) >= 6, 60, "the load to get going")
        busy = wait_for(
            lambda: next((rid for rid, n in gw.gw.inflight.running.items() if n >= 2), None), 30, "a busy replica"
        )
        frozen = gw.backend.pid(busy)
        os.kill(frozen, signal.SIGSTOP)
        frozen_at = time.monotonic()
        wait_for(lambda: busy in gw.gw.liveness.unresponsive, 2 * deadline_s + 10, "the replica to be declared")
        served = sum(o[3] for o in outcomes)
        wait_for(lambda: sum(o[3] for o in outcomes) >= served + 12, 90, "requests after the freeze to succeed")
        stop.set()
        for w in workers:
            w.join(120)
    finally:
        stop.set()
        if frozen is not None:
            try:
                os.kill(frozen, signal.SIGKILL)
            except ProcessLookupError:
                pass
        gw.stop()
    assert unfinished == [], unfinished
    failed_before_a_byte = [o for o in outcomes if not o[3] and not (o[0] and "data:" in o[4].split('"error"')[0])]
    assert failed_before_a_byte == [], failed_before_a_byte
    broken = [o for o in outcomes if not o[3]]
    assert all("replica_" in o[4] for o in broken), broken  # mid-stream: the error event names the failure
    # Nothing hung until the replica was killed (47 s before): each request in flight at the freeze, or
    # started after it, ended within the deadline, a health check and a fresh run elsewhere.
    during = [o for o in outcomes if o[1] + o[2] > frozen_at]
    assert during and max(o[2] for o in during) < 2 * deadline_s + 20, sorted(o[2] for o in during)[-5:]
    print(
        f"frozen replica: {len(outcomes)} requests, {len(broken)} streams ended by an error event, slowest "
        f"during the freeze {max(o[2] for o in during):.1f} s"
    )


def test_replicas_that_left_the_fleet_are_forgotten():
    revived: list[str] = []

    async def main() -> None:
        live = Liveness(on_revive=revived.append)
        live.declare("gone", "no first byte")
        live.declare("kept", "no first byte")
        live.forget(["kept", "other"])
        assert set(live.unresponsive) == {"kept"} and revived == ["gone"]

    asyncio.run(main())


def test_a_late_first_byte_on_a_replica_that_answers_its_probe_times_out_that_request_alone():
    async def main() -> None:
        live = Liveness()

        async def alive() -> bool:
            return True

        async def neighbour() -> str:
            async with live.deadline("a", 60, "first byte", alive):
                await asyncio.sleep(0.3)
            return "answered"

        async def late() -> str:
            async with live.deadline("a", 0.05, "first byte", alive):
                await asyncio.Event().wait()
            return "answered"

        results = await asyncio.gather(neighbour(), late(), return_exceptions=True)
        assert results[0] == "answered"  # its deadline was not moved
        assert isinstance(results[1], RequestTimeout) and results[1].seconds == 0.05
        assert live.unresponsive == {}

    asyncio.run(main())


def test_a_late_first_byte_on_a_replica_that_does_not_answer_its_probe_declares_it():
    async def main() -> None:
        live = Liveness()

        async def dead() -> bool:
            return False

        with pytest.raises(Unresponsive, match="no answer to its health probe"):
            async with live.deadline("a", 0.05, "first byte", dead):
                await asyncio.Event().wait()
        assert "a" in live.unresponsive

    asyncio.run(main())


def test_a_replica_that_makes_progress_on_none_of_its_streams_is_declared_even_if_it_answers_its_probe():
    """An engine that stopped (its HTTP loop still answers /health): every stream waits, none moves."""

    async def main() -> None:
        live = Liveness()
        probes: list[bool] = []

        async def alive() -> bool:
            probes.append(True)
            return True

        async def stuck_stream() -> None:
            async with live.deadline("a", 60, MID_STREAM, alive):
                await asyncio.Event().wait()

        live.progress("a")
        others = [asyncio.ensure_future(stuck_stream()) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(Unresponsive, match="no progress on any of its 3 streams"):
            async with live.deadline("a", 0.1, "first byte", alive):
                await asyncio.Event().wait()
        results = await asyncio.gather(*others, return_exceptions=True)
        assert all(isinstance(r, Unresponsive) for r in results)  # declared: they give up at once
        assert probes == []

        # The same wait while a neighbour's chunks keep coming: this request alone times out.
        live.revive("a")
        moving = asyncio.ensure_future(stuck_stream())

        async def chunks() -> None:
            for _ in range(20):
                live.progress("a")
                await asyncio.sleep(0.01)

        feeder = asyncio.ensure_future(chunks())
        await asyncio.sleep(0)
        with pytest.raises(RequestTimeout):
            async with live.deadline("a", 0.1, "first byte", alive):
                await asyncio.Event().wait()
        assert live.unresponsive == {} and probes == [True]
        moving.cancel()
        await asyncio.gather(moving, feeder, return_exceptions=True)

    asyncio.run(main())
