"""The one rule for which requests a tandem replica keeps a track of (tandem.serve.kept_tracks) when
the gateway's gate asks: both processes import it, so they cannot drift apart.

A replica keeps a track (the logprob of each token it generates and its top-1 alternative) for
one text prompt answered by one choice, without echo and without logprobs the client asked for:
the pairs the gate scores teacher-forced from a kept track. The gateway asks only for those
(KEEP_TRACK_HEADER); a replica that did keep one says so in its answer's headers
(KEPT_TRACK_HEADER, before a stream's first byte), so the gateway never guesses: no header, no
track to fetch, and the gate scores that pair by an echo instead.
"""

from __future__ import annotations

from typing import Any

from tandem.contracts import KEEP_TRACK_HEADER, KEPT_TRACK_PATH

__all__ = ["COMPLETIONS", "KEEP_TRACK_HEADER", "KEPT_TRACK_HEADER", "KEPT_TRACK_PATH", "keeps_track"]

COMPLETIONS = "/v1/completions"
KEPT_TRACK_HEADER = "x-tandem-kept-track"  # the replica's answer: "1" when it keeps this request's track


def keeps_track(path: str, *, prompt: Any, n: Any = None, logprobs: Any = None, echo: Any = None) -> bool:
    """Whether a request to `path` with these fields is one a replica keeps a track of when asked."""
    return path == COMPLETIONS and isinstance(prompt, str) and n in (None, 1) and logprobs is None and not echo
