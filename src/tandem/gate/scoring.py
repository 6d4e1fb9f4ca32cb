"""Scoring a pair's accuracy over HTTP: teacher-forced with `echo` where the servers take it.

For a completions pair, the candidate is sent the prompt plus the incumbent's completion with
`echo: true, logprobs: 1, max_tokens: 0` (OpenAI's legacy completions API and vLLM: the answer
repeats the prompt with a logprob and the top alternative for each of its tokens, the first one
null). The incumbent's own logprobs of the same tokens, even when the client never asked for
logprobs, come the cheap way where they can: its tandem replica kept them while it generated the
answer (`Kept`: tandem.edge.keep_track.KEEP_TRACK_HEADER) and hands them over once. Only where that
track is missing (another engine, evicted) or tokenized differently is the incumbent sent the
same echo: a scoring prefill on a replica that serves clients, which is what the kept track saves.

A server that refuses `echo` (any 4xx) or ignores it turns teacher forcing off for the rest of
the gate's life: every later pair is judged on its shared prefix (tandem.gate.agreement), and
`unsupported` says why, for the report. Chat pairs and prompts that are not one string have no
text to echo; they are judged on their shared prefix too. A scoring request that fails
otherwise (5xx, a transport error) falls back for that pair only and is counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from tandem.edge.keep_track import COMPLETIONS, KEPT_TRACK_PATH
from tandem.gate.agreement import (
    TokenAgreement,
    TrackMismatch,
    completion_start,
    shared_prefix,
    teacher_forced,
    teacher_forced_kept,
)
from tandem.measure.logprobs import TokenTrack, parse_logprobs
from tandem.measure.observation import Observation

__all__ = ["Scorer", "Kept", "echo_body", "COMPLETIONS"]


class _EchoRejected(Exception):
    """The server does not do teacher-forced scoring (4xx, or an answer without the echoed logprobs)."""


class _ScoringFailed(Exception):
    """A scoring request failed for a passing reason (5xx, transport)."""


@dataclass(frozen=True)
class Kept:
    """Where the incumbent's answer to a mirrored request left its track: the replica that served it, the key."""

    url: str
    key: str


def echo_body(model: Any, text: str) -> dict[str, Any]:
    return {"model": model, "prompt": text, "echo": True, "logprobs": 1, "max_tokens": 0, "temperature": 0}


def _message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        return str(error.get("message") if isinstance(error, dict) else error)
    except (ValueError, AttributeError):
        return response.text[:200]


def _spelling(track: TokenTrack, completion: str) -> TokenTrack | None:
    """The leading tokens of a kept track that spell the start of `completion`. A stop string cuts the
    text, not the tokens: the generated tokens run on past the end of what the client got."""
    at = count = 0
    for token in track.tokens:
        if not token or not completion.startswith(token, at):
            break
        at += len(token)
        count += 1
    if count == 0:
        return None
    return track.span(0, count)


class Scorer:
    def __init__(self, client: httpx.AsyncClient, timeout_s: float = 120.0) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self.unsupported: str | None = None  # why teacher forcing is off; None while it works (or is untried)
        self.teacher_forced = 0  # pairs scored teacher-forced
        self.failures = 0  # scoring requests that failed for a passing reason
        self.mismatches = 0  # pairs whose two echoes tokenized differently
        self.kept = 0  # pairs whose incumbent side was its replica's kept track (no scoring prefill there)
        self.kept_missed = 0  # pairs with a kept track asked for but not usable: echoed on the incumbent

    async def _kept(self, kept: Kept, headers: Mapping[str, str], completion: str) -> TokenTrack | None:
        """The incumbent's kept track of `completion`, or None (any failure: the echo is the way then)."""
        try:
            response = await self.client.get(
                f"{kept.url}{KEPT_TRACK_PATH}/{kept.key}", headers=dict(headers), timeout=self.timeout_s
            )
            raw = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        if not isinstance(raw, dict) or raw.get("text") != completion:
            return None
        track = parse_logprobs(raw.get("logprobs"))
        return None if track is None else _spelling(track, completion)

    async def _echo(self, url: str, body: dict[str, Any], headers: Mapping[str, str], completion: str):
        try:
            response = await self.client.post(url, json=body, headers=dict(headers), timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise _ScoringFailed(f"{type(exc).__name__}: {exc}") from None
        if 400 <= response.status_code < 500:
            raise _EchoRejected(f"HTTP {response.status_code}: {_message(response)}")
        if response.status_code != 200:
            raise _ScoringFailed(f"HTTP {response.status_code}: {_message(response)}")
        try:
            choice = response.json()["choices"][0]
            text = choice["text"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise _EchoRejected("the answer to an echo request is not a completion") from None
        track = parse_logprobs(choice.get("logprobs"))
        if not isinstance(text, str) or not text.endswith(completion) or track is None or not track.tokens:
            raise _EchoRejected("the server ignored echo (its answer did not repeat the prompt with logprobs)")
        return text, track

    async def agreement(
        self,
        path: str,
        body: Mapping[str, Any],
        incumbent: Observation,
        candidate: Observation,
        *,
        incumbent_url: str | None,
        candidate_url: str | None,
        headers: Mapping[str, str] | None = None,
        greedy: bool = False,
        kept: Kept | None = None,
    ) -> tuple[TokenAgreement | None, str | None]:
        """(agreement, note): the best token-level evidence this pair allows, and why not better."""
        note = None
        prompt = body.get("prompt")
        if path != COMPLETIONS or not isinstance(prompt, str):
            note = "no single text prompt to echo"
        elif self.unsupported is not None:
            note = "teacher forcing is off (the servers reject echo)"
        elif not incumbent.text:
            note = "the incumbent's completion is empty"
        elif incumbent_url is None or candidate_url is None:
            note = "no replica to score on"
        else:
            scoring = echo_body(body.get("model"), prompt + incumbent.text)
            hdrs = headers or {}
            try:
                if kept is not None:
                    own, (text, cand) = await asyncio.gather(
                        self._kept(kept, hdrs, incumbent.text),
                        self._echo(candidate_url + COMPLETIONS, scoring, hdrs, incumbent.text),
                    )
                    if own is not None:
                        try:
                            result = teacher_forced_kept(own, cand, completion_start(cand, text, len(incumbent.text)))
                            self.teacher_forced += 1
                            self.kept += 1
                            return result, None
                        except TrackMismatch:
                            pass  # the echo tokenized the completion another way: score both sides by echo
                    self.kept_missed += 1
                    text, inc = await self._echo(incumbent_url + COMPLETIONS, scoring, hdrs, incumbent.text)
                else:
                    (text, inc), (_, cand) = await asyncio.gather(
                        self._echo(incumbent_url + COMPLETIONS, scoring, hdrs, incumbent.text),
                        self._echo(candidate_url + COMPLETIONS, scoring, hdrs, incumbent.text),
                    )
                result = teacher_forced(inc, cand, completion_start(inc, text, len(incumbent.text)))
                self.teacher_forced += 1
                return result, None
            except _EchoRejected as exc:
                self.unsupported = str(exc)
                note = f"teacher forcing is off: {exc}"
            except _ScoringFailed as exc:
                self.failures += 1
                note = f"scoring failed: {exc}"
            except TrackMismatch as exc:
                self.mismatches += 1
                note = str(exc)
        return self._prefix(incumbent.tokens, candidate.tokens, greedy, note)

    @staticmethod
    def _prefix(
        inc: TokenTrack | None, cand: TokenTrack | None, greedy: bool, note: str | None
    ) -> tuple[TokenAgreement | None, str | None]:
        if inc is None or cand is None:
            return None, f"{note}; no logprobs in the answers to compare" if note else "no logprobs to compare"
        return shared_prefix(inc, cand, greedy), note
