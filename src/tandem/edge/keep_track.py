"""The gate's side channel to a tandem replica over HTTP: the header that asks a replica to keep a
request's track and the path the gate fetches it from. The gateway (tandem.gateway.shadow, tandem.gate)
and the replica's server (tandem.serve) both import it; standard library only.
"""

from __future__ import annotations

__all__ = ["KEEP_TRACK_HEADER", "KEPT_TRACK_PATH"]

# The gate's side channel to a tandem replica (HTTP, both ends named here only). A gateway that
# mirrors a completions request asks the incumbent's replica, with this header (value: a random
# key), to keep the logprobs it computes while generating the answer (each token's own logprob
# and the top-1 alternative), without sending them to the client; the gate then fetches them once
# with GET {KEPT_TRACK_PATH}/{key}. That is the incumbent's side of teacher-forced scoring for
# free: a second, scoring prefill on the client-facing replica is what it saves. A server that
# ignores the header (another engine) answers 404 there, and the gate echoes on it instead.
KEEP_TRACK_HEADER = "x-tandem-keep-track"
KEPT_TRACK_PATH = "/gate/tracks"
