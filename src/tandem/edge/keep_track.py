"""The gate's side channel to a tandem replica over HTTP, and the one rule for which requests a
replica keeps a track of: the header that asks a replica to keep a request's track, the header its
answer says it did with, and the path the gate fetches it from. The gateway (tandem.gateway.shadow,
tandem.gate) and the replica's server (tandem.serve, tandem.serve.kept_tracks) both import it, so
the two processes cannot drift apart; standard library only.

A gateway that mirrors a completions request asks the incumbent's replica, with KEEP_TRACK_HEADER
(value: a random key), to keep the logprobs it computes while generating the answer (each token's
own logprob and the top-1 alternative), without sending them to the client; the gate then fetches
them once with GET {KEPT_TRACK_PATH}/{key}. That is the incumbent's side of teacher-forced scoring
for free: a second, scoring prefill on the client-facing replica is what it saves.

A replica keeps a track (`keeps_track`) for one text prompt answered by one choice, without echo
and without logprobs the client asked for: the pairs the gate scores teacher-forced. The gateway
asks only for those; a replica that keeps one says so in its answer's headers (KEPT_TRACK_HEADER:
"1", before a stream's first byte), so the gateway never guesses: no header (another engine, a
replica that ignored the ask), no fetch, and the gate scores that pair by an echo instead.
"""

from __future__ import annotations

from typing import Any

__all__ = ["COMPLETIONS", "KEEP_TRACK_HEADER", "KEPT_TRACK_HEADER", "KEPT_TRACK_PATH", "keeps_track"]

COMPLETIONS = "/v1/completions"
KEEP_TRACK_HEADER = "x-tandem-keep-track"
KEPT_TRACK_HEADER = "x-tandem-kept-track"
KEPT_TRACK_PATH = "/gate/tracks"


def keeps_track(path: str, *, prompt: Any, n: Any = None, logprobs: Any = None, echo: Any = None) -> bool:
    """Whether a request to `path` with these fields is one a replica keeps a track of when asked."""
    return path == COMPLETIONS and isinstance(prompt, str) and n in (None, 1) and logprobs is None and not echo
