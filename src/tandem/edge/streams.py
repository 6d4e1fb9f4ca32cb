"""Server-sent events and noticing a client that left: what both apps need to stream and to stop work.

`sse(data)` frames one event and `SSE_DONE` ends an OpenAI stream. `until_disconnect(work, receive)`
awaits `work` but cancels it (raising ClientDisconnected) as soon as the client goes away: for a
request whose body was read, the next ASGI message is http.disconnect.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.types import Receive

__all__ = ["SSE_DONE", "ClientDisconnected", "sse", "until_disconnect"]

T = TypeVar("T")
SSE_DONE = b"data: [DONE]\n\n"


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class ClientDisconnected(Exception):
    """The client closed the connection before the response was ready."""


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(work: Awaitable[T], receive: Receive) -> T:
    """Await `work`, cancelling it (and raising ClientDisconnected) if the client goes away first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientDisconnected()
    finally:
        for pending in (task, watcher):
            pending.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
