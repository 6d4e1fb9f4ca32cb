"""Deadlines per request: a replica that misses one is declared unresponsive, routing is told, and every
request waiting on it gives up at once; a non-streaming wait asks the replica before giving up."""

from __future__ import annotations

import asyncio

import pytest

from tandem.gateway.liveness import Liveness, Unresponsive


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
