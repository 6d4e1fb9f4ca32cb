"""Kept tracks: a finished completion's own logprobs, held for the gateway's validation gate.

A gateway mirroring a request to a candidate needs the incumbent's logprob of each token it
generated, and its top-1 alternative, to score the pair teacher-forced. The replica computes them
anyway while it decodes (one log-softmax row per token), so instead of a second scoring prefill
on this client-facing replica, the gateway marks the request with `KEEP_TRACK_HEADER` (a random
key); the answer the client gets is unchanged (no logprobs unless it asked) and the track waits
here for one `GET KEPT_TRACK_PATH/{key}`, which removes it. Only a replica of a gateway's fleet
keeps tracks, and only for requests carrying the fleet's secret: a lone replica ignores the header
(any client could otherwise make it store what it likes).

Bounded: at most `capacity` tracks, the oldest evicted first (a gate that never comes to fetch
costs a little memory, never unbounded). Only single-choice completions without echo and
without client logprobs are kept: those are the ones the gate scores this way.
"""

from __future__ import annotations

import hmac
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter
from pydantic import SecretStr

from tandem.edge.auth import bearer_token
from tandem.edge.errors import APIError
from tandem.edge.keep_track import KEEP_TRACK_HEADER, KEPT_TRACK_PATH

__all__ = ["KeptTracks", "keep_key", "build_kept_tracks_router"]

_KEY = re.compile(r"[A-Za-z0-9_-]{8,64}")


def keep_key(headers: Mapping[str, str], fleet_secret: SecretStr | None) -> str | None:
    """The key a gateway asked this request's track to be kept under; None when not asked (or malformed),
    and on a replica outside a fleet (no `fleet_secret`) or a request without the fleet's secret: only
    the gateway that started this replica may make it store tracks."""
    key = headers.get(KEEP_TRACK_HEADER)
    if key is None or fleet_secret is None or not _KEY.fullmatch(key):
        return None
    token = bearer_token(headers.get("authorization"))
    secret = fleet_secret.get_secret_value().encode()
    if token is None or not hmac.compare_digest(token.encode("latin-1", "replace"), secret):
        return None
    return key


class KeptTracks:
    def __init__(self, capacity: int = 512) -> None:
        self.capacity = capacity
        self._tracks: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()  # completions finish on the event loop; tests may call from threads
        self.evicted = 0

    def keep(self, key: str, text: str, logprobs: Mapping[str, Any]) -> None:
        """The completion's text and its logprobs in the completions API's format (tokens, token_logprobs, ...)."""
        with self._lock:
            self._tracks[key] = {"text": text, "logprobs": dict(logprobs)}
            self._tracks.move_to_end(key)
            while len(self._tracks) > self.capacity:
                self._tracks.popitem(last=False)
                self.evicted += 1

    def pop(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self._tracks.pop(key, None)

    def __len__(self) -> int:
        return len(self._tracks)


def build_kept_tracks_router(tracks: KeptTracks) -> APIRouter:
    router = APIRouter()

    @router.get(KEPT_TRACK_PATH + "/{key}")
    async def kept_track(key: str) -> dict:
        """The kept track of a finished completion (once: it is removed), or 404."""
        track = tracks.pop(key)
        if track is None:
            raise APIError(
                404, f"no kept track {key!r} (never kept, already fetched, or evicted)", code="track_not_found"
            )
        return track

    return router
