"""Streams: merging the n choices of a request into server-sent events, and noticing a client that left
(SSE framing and disconnect detection are shared with the gateway: tandem.edge.streams).

A client that goes away must free its KV slots at once. Streaming responses learn it from Starlette
(which cancels the body iterator on http.disconnect); non-streaming ones race the generation
against the next ASGI message, which for a request whose body was read is http.disconnect.
Either way the engine iterators are closed, and closing one aborts its request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from typing import TypeVar

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tandem.edge.streams import SSE_DONE, ClientDisconnected, sse, until_disconnect

__all__ = ["sse", "SSE_DONE", "merge", "SSEResponse", "ClientDisconnected", "until_disconnect"]

T = TypeVar("T")


async def merge(iterators: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Interleave several async iterators as (position, item), in arrival order.

    Closing the merged iterator closes every source (aborting their engine requests); an error in
    one source closes the others and is raised here.
    """
    if len(iterators) == 1:  # the common case needs no tasks
        async with aclosing(iterators[0]) as only:
            async for item in only:
                yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(position: int, source: AsyncIterator[T]) -> None:
        try:
            async with aclosing(source) as items:
                async for item in items:
                    queue.put_nowait((position, item))
        except Exception as exc:  # handed to the consumer, which re-raises it
            queue.put_nowait((position, exc))
        finally:
            queue.put_nowait((position, done))

    tasks = [asyncio.create_task(pump(i, it)) for i, it in enumerate(iterators)]
    try:
        remaining = len(tasks)
        while remaining:
            position, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield position, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class SSEResponse(StreamingResponse):
    """A text/event-stream response that always closes its body iterator and runs `on_close`.

    `farewell` is sent if the server cancels the stream at its shutdown deadline.

    Starlette cancels the sending task when the client disconnects; if that lands while the body
    iterator is suspended, nothing would close it until garbage collection. Here it closes at once.
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        on_close: Callable[[], None],
        farewell: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
        )
        self._source = content
        self._on_close = on_close
        self._farewell = farewell

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except asyncio.CancelledError:
            # A client disconnect is handled inside Starlette's task group; a cancellation that gets
            # here is the server's shutdown deadline. End the stream with a last event rather than
            # a cut connection (and a traceback in the log).
            with contextlib.suppress(Exception):  # the client may be gone as well
                await send({"type": "http.response.body", "body": self._farewell, "more_body": False})
        finally:
            try:
                await self._source.aclose()
            finally:
                self._on_close()
