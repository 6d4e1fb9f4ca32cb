"""The upstream: the gateway's HTTP side to its replicas. One kept client (opened on the event loop,
closed at shutdown), its timeouts, the liveness deadlines that judge replicas
(tandem.gateway.liveness), and the fleet's secret every request to a replica carries (the client's
own key stays at the gateway).

The transport is injected: httpx's by default, an `httpx.MockTransport` (or a faulty one) in tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from tandem.gateway.liveness import Liveness, Probe
from tandem.schedule.fallback import FailureKind, classify_status

__all__ = ["Started", "Upstream"]


@dataclass(frozen=True)
class Started:
    """A stream whose first bytes came: the replica said 2xx and the relay reads the rest."""

    first: bytes
    chunks: AsyncIterator[bytes]  # the rest


@dataclass
class Upstream:
    transport: httpx.AsyncBaseTransport | None = None
    read_timeout_s: float = 300.0
    load_timeout_s: float = 1.0  # a replica's GET /load must answer within this
    first_byte_timeout_s: float = 30.0  # tandem.gateway.liveness
    stream_idle_timeout_s: float = 30.0
    health_timeout_s: float = 2.0  # a replica that missed a deadline must answer GET /health within this
    max_resumes: int = 2  # a stream that breaks mid-way is resumed elsewhere at most this often (gateway.resumer)
    fleet_secret: str | None = field(default=None, repr=False)  # sent to replicas as their bearer token
    liveness: Liveness = field(default_factory=Liveness)
    client: httpx.AsyncClient | None = None

    def open(self) -> httpx.AsyncClient:
        """The kept client (made once, on the event loop that uses it)."""
        if self.client is None:
            self.client = httpx.AsyncClient(
                transport=self.transport,
                timeout=httpx.Timeout(connect=5.0, read=self.read_timeout_s, write=30.0, pool=None),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
                headers={"Authorization": f"Bearer {self.fleet_secret}"} if self.fleet_secret else None,
            )
        return self.client

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    async def answer(
        self, replica_id: str, url: str, body: bytes, headers: dict[str, str], probe: Probe
    ) -> httpx.Response:
        """POST `body` to `url` and read the whole answer, within the first-byte deadline (a replica
        that misses it is judged by `probe`: tandem.gateway.liveness)."""
        assert self.client is not None
        post = self.client.post(url, content=body, headers=headers)  # read whole, then closed
        return await self.liveness.answer(replica_id, post, self.first_byte_timeout_s, probe)

    async def start_stream(
        self, replica_id: str, url: str, body: bytes, headers: dict[str, str], probe: Probe
    ) -> tuple[httpx.Response, Started | tuple[bytes, FailureKind | None]]:
        """Send a streaming request; within the first-byte deadline, read its first chunk (a 2xx) or its
        whole answer (anything else). The upstream stays open for the relay in the first case."""
        assert self.client is not None
        upstream = None
        try:
            async with self.liveness.deadline(replica_id, self.first_byte_timeout_s, "first byte", probe):
                request = self.client.build_request("POST", url, content=body, headers=headers)
                upstream = await self.client.send(request, stream=True)
                kind = classify_status(upstream.status_code)
                if kind is None:
                    chunks = upstream.aiter_bytes()
                    first = b""
                    while not first:  # the first bytes, before committing our own 200
                        first = await chunks.__anext__()
                    self.liveness.progress(replica_id)
                    return upstream, Started(first, chunks)
                content = await upstream.aread()
                await upstream.aclose()
                return upstream, (content, kind)
        except BaseException:
            if upstream is not None:
                await upstream.aclose()
            raise

    async def answers_health(self, url: str) -> bool:
        """Whether GET `url` (a replica's health or readiness path) answers 200 within health_timeout_s
        (a frozen replica does not)."""
        assert self.client is not None
        try:
            return (await self.client.get(url, timeout=self.health_timeout_s)).status_code == 200
        except httpx.HTTPError:
            return False
