"""GET /kv/events?since=SEQ: which KV blocks this replica's block cache stored and evicted.

The feed the gateway's kv-aware router reads (tandem.contracts.KVEvents): the net change since the
event `since` the reader saw last, numbered up to `seq`; `reset: true` with every block held when
the gap is older than the engine's log keeps or `since` is not of this replica's life (a restart:
tandem.engine.kv_event_log). Hashes are the contract's chain with the block size and hash seed that
GET /load also reports. Behind the fleet's secret (or the API key) like the model's routes: a block
hash tells whoever can compute it whether someone sent that prompt.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from tandem.contracts import KV_EVENTS_PATH
from tandem.edge.errors import APIError
from tandem.serve.state import ServerState

__all__ = ["build_kv_events_router"]

_MAX_SEQ = 2**63 - 1


def parse_since(raw: str | None) -> int:
    """The `since` query parameter: an event number >= 0 (0, or absent: from the start, a reset)."""
    if raw is None:
        return 0
    try:
        since = int(raw)
    except ValueError:
        since = -1
    if not 0 <= since <= _MAX_SEQ:
        raise APIError(
            400,
            f"since must be an event number (an integer >= 0), got {raw[:40]!r}",
            param="since",
            code="invalid_since",
        )
    return since


def build_kv_events_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.get(KV_EVENTS_PATH)
    async def kv_events(request: Request) -> dict:
        """Block hashes stored and removed since event `since` (tandem.contracts.KVEvents)."""
        since = parse_since(request.query_params.get("since"))
        served = state.require_model()
        return served.engine.kv_events.since(since).to_json()

    return router
