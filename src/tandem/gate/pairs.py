"""A pair: one mirrored request, what the incumbent and the candidate answered, and how alike they were.

Pairs are the gate's only evidence about traffic; PairLog keeps them (bounded) and writes each as
a JSON line when given a sink, so every verdict can be re-derived from what was recorded.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tandem.gate.agreement import TokenAgreement
from tandem.measure.observation import Observation

__all__ = ["Pair", "PairLog", "Sampling"]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Sampling:
    """The client's sampling parameters, as the mirror kept them."""

    temperature: float | None = None  # None: the server's default (1.0 in OpenAI's API and vLLM)
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    max_tokens: int | None = None
    stream: bool = False
    logprobs: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Sampling:
        top_k, seed = body.get("top_k"), body.get("seed")
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        return cls(
            temperature=_number(body.get("temperature")),
            top_p=_number(body.get("top_p")),
            top_k=top_k if isinstance(top_k, int) and not isinstance(top_k, bool) else None,
            seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
            max_tokens=max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else None,
            stream=body.get("stream") is True,
            logprobs=bool(body.get("logprobs") or body.get("top_logprobs")),
        )


@dataclass(frozen=True)
class Pair:
    request_id: str
    path: str  # /v1/completions or /v1/chat/completions
    at: float  # when the request arrived, on the gate's clock
    sampling: Sampling
    incumbent: Observation
    candidate: Observation
    agreement: TokenAgreement | None = None  # token-level evidence, when it could be had
    note: str | None = None  # why there is no agreement, when there is none

    @property
    def comparable(self) -> bool:
        """Both answered: the pair says something about latency and accuracy."""
        return self.incumbent.ok and self.candidate.ok

    @property
    def candidate_failed(self) -> bool:
        """The candidate failed a request the incumbent served (the client's bad requests fail both)."""
        return self.incumbent.ok and not self.candidate.ok

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "path": self.path,
            "at": self.at,
            "sampling": asdict(self.sampling),
            "incumbent": self.incumbent.to_dict(),
            "candidate": self.candidate.to_dict(),
            "agreement": None if self.agreement is None else self.agreement.to_dict(),
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Pair:
        agreement = raw.get("agreement")
        return cls(
            raw["request_id"],
            raw["path"],
            float(raw["at"]),
            Sampling(**raw["sampling"]),
            Observation.from_dict(raw["incumbent"]),
            Observation.from_dict(raw["candidate"]),
            None if agreement is None else TokenAgreement.from_dict(agreement),
            raw.get("note"),
        )


class PairLog:
    """The recorded pairs, newest `limit` kept; `sink` (e.g. a file's write) gets each as a JSON line.

    Thread-safe: the mirror adds from the event loop, the gate reads from the controller's thread.
    """

    def __init__(self, limit: int = 100_000, sink: Callable[[str], Any] | None = None) -> None:
        self._pairs: deque[Pair] = deque(maxlen=limit)
        self._sink = sink
        self._lock = threading.Lock()
        self.total = 0  # every pair ever added, including ones the limit pushed out

    def add(self, pair: Pair) -> None:
        with self._lock:
            self._pairs.append(pair)
            self.total += 1
        if self._sink is not None:
            self._sink(json.dumps(pair.to_dict(), separators=(",", ":")) + "\n")

    def snapshot(self) -> tuple[Pair, ...]:
        with self._lock:
            return tuple(self._pairs)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pairs)
