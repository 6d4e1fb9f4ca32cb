"""AsyncEngine: the Engine stepped by a background thread, with an async iterator per request.

The engine is not thread-safe, so only the step thread touches it: callers hand it commands (add,
abort) through a queue, and outputs travel back to each caller's event loop. Cancelling the
iterator (a client went away) aborts the request, which frees its KV blocks at the next step.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from tandem.engine.engine import Engine, RequestError
from tandem.engine.outputs import RequestOutput
from tandem.engine.processor_tables import ProcessorTables
from tandem.engine.sampling_params import SamplingParams

__all__ = ["AsyncEngine", "EngineStoppedError"]


class EngineStoppedError(RuntimeError):
    """The engine's step loop stopped (shutdown or a fatal error) before the request finished."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


class AsyncEngine:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()  # guards _streams only; never held during a step
        self._ids = itertools.count()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tandem-engine", daemon=True)
        self._thread.start()

    # -- caller side (any thread, usually an event loop) ---------------------------------------

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        group: str | None = None,
        tables: ProcessorTables | None = None,
        continued: int = 0,
        released: int = 0,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Yield incremental outputs until the request finishes. Bad prompts raise RequestError here.
        `group` and `tables`: as Engine.add_request's (build tables off the event loop, with
        `engine.processor_tables`, and share them between a request's choices); `continued`, `released`:
        a resumed stream's (Engine.add_request)."""
        if self._stopped.is_set():
            raise EngineStoppedError("the engine is stopped")
        params = params or SamplingParams()
        ids = self.engine.validate_prompt(prompt)
        self.engine.validate_params(params)
        request_id = request_id if request_id is not None else f"areq-{next(self._ids)}"
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        with self._lock:
            if request_id in self._streams:
                raise RequestError(f"request id {request_id!r} is already in use")
            self._streams[request_id] = stream
        self._commands.put(("add", request_id, ids, params, group, tables, (continued, released), priority))
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            with self._lock:
                self._streams.pop(request_id, None)
            if not finished:
                self._commands.put(("abort", request_id))

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    @property
    def num_running(self) -> int:
        return self.engine.num_running

    @property
    def num_waiting(self) -> int:
        return self.engine.num_waiting + self._commands.qsize()

    @property
    def prefill_tokens(self) -> int:
        return self.engine.prefill_tokens

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopped.set()
        self._commands.put(("wake",))
        self._thread.join(timeout)

    # -- the step thread ------------------------------------------------------------------------

    def _deliver(self, request_id: str, item: object) -> None:
        with self._lock:
            stream = self._streams.get(request_id)
        if stream is not None:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)

    def _apply(self, command: tuple) -> None:
        if command[0] == "add":
            _, request_id, ids, params, group, tables, (continued, released), priority = command
            try:
                self.engine.add_request(
                    ids,
                    params,
                    request_id,
                    group=group,
                    tables=tables,
                    continued=continued,
                    released=released,
                    priority=priority,
                )
            except RequestError as exc:
                self._deliver(request_id, exc)
        elif command[0] == "abort":
            self.engine.abort(command[1])

    def _run(self) -> None:
        while not self._stopped.is_set():
            # Block for work when idle; otherwise apply whatever arrived since the last step.
            if not self.engine.has_unfinished():
                self._apply(self._commands.get())
            while not self._commands.empty():
                self._apply(self._commands.get_nowait())
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a failed step fails its requests, not the whole server
                self._fail_all(exc)
                continue
            for out in outputs:
                self._deliver(out.request_id, out)
        self._fail_all(EngineStoppedError("the engine stopped before the request finished"))

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            ids = list(self._streams)
        for request_id in ids:
            self.engine.abort(request_id)
            self._deliver(request_id, exc)
