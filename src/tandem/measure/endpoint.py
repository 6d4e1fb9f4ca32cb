"""A Profile of any running OpenAI-compatible server, measured black-box (`tandem profile --endpoint URL`).

vLLM, SGLang, llama.cpp's server or a tandem replica: the scheduling layer sizes, prices and
simulates them all from the same Profile, so an external variant is measured the way a tandem
recipe is, from the outside: streamed `/v1/completions` requests (recorded by the gate's own
recorder, tandem.measure.observation) with prompts of held-out code, each one distinct (a server's
prefix cache must not make prefill look free).

- TTFT p50: lone streamed requests with a ~`prompt_tokens` prompt.
- Prefill tokens/s: a long prompt (`long_prompt_tokens`, as counted by the server's `usage`) with
  one output token: prompt tokens / the request's time, as tandem's own profile measures it.
- Decode tokens/s by concurrency (1, 4, 8, ...): `c` streams at once, `new_tokens` each
  (`ignore_eos` where the server takes it). While all `c` are decoding, the replica's output rate
  is the sum of their rates (`decode_rate`); a server that runs fewer at once than it is sent (a
  queue: llama-cpp-python runs one) has no such window, and the rate is all output tokens over
  the span from the first output token to the last. Levels stop once the rate grows by less
  than `saturation` over the previous level; `max_slots` is the last level measured.

What cannot be seen from outside stays 0 and is said in `source_note`: weights and KV bytes (give
`resources.memory` to a Ray deployment), the KV budget, the cold start (`cold_start_s`, given).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from tandem.contracts import Profile
from tandem.measure.observation import Observation, observe
from tandem.workload import heldout_texts

__all__ = ["EndpointError", "StreamTiming", "decode_rate", "measure_endpoint", "profile_endpoint_cli"]

CHARS_PER_TOKEN = 4  # a first guess to cut prompt text; the server's usage counts the real tokens


class EndpointError(RuntimeError):
    """The endpoint cannot be profiled (unreachable, refuses completions); the message says why."""


@dataclass(frozen=True)
class StreamTiming:
    """One streamed answer: when its first and last output tokens came (seconds, one clock), how many."""

    first_s: float
    last_s: float
    tokens: int


def decode_rate(streams: Sequence[StreamTiming]) -> float:
    """Output tokens/s of a replica serving `streams` at once (see the module's docstring)."""
    streams = [s for s in streams if s.tokens >= 2 and s.last_s > s.first_s]
    if not streams:
        raise EndpointError("no stream produced two output tokens: cannot time decoding")
    window = min(s.last_s for s in streams) - max(s.first_s for s in streams)
    typical = statistics.median(s.last_s - s.first_s for s in streams)
    if window >= 0.5 * typical:  # every stream decoding together for most of its run
        return sum((s.tokens - 1) / (s.last_s - s.first_s) for s in streams)
    span = max(s.last_s for s in streams) - min(s.first_s for s in streams)
    return sum(s.tokens - 1 for s in streams) / span


class _Prompts:
    """Distinct prompts of held-out code, about `tokens` long each."""

    def __init__(self) -> None:
        self.text = "\n".join(heldout_texts())
        self.at = 0

    def take(self, tokens: int) -> str:
        size = max(1, tokens * CHARS_PER_TOKEN)
        if self.at + size > len(self.text):
            self.at = 0
        self.at += size
        return self.text[self.at - size : self.at]


class _Endpoint:
    def __init__(self, client: httpx.AsyncClient, url: str, model: str, clock: Callable[[], float]) -> None:
        self.client, self.url, self.model, self.clock = client, url.rstrip("/"), model, clock
        self.ignore_eos = True  # dropped at the first 4xx that names it

    async def complete(self, prompt: str, max_tokens: int, *, stream: bool) -> tuple[float, Observation]:
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        if self.ignore_eos:
            body["ignore_eos"] = True
        started = self.clock()
        seen = await observe(
            self.client, self.url + "/v1/completions", json.dumps(body).encode(), clock=self.clock, stream=stream,
            headers={"content-type": "application/json"},
        )  # fmt: skip
        if seen.status in (400, 422) and self.ignore_eos:
            self.ignore_eos = False
            return await self.complete(prompt, max_tokens, stream=stream)
        if not seen.ok:
            raise EndpointError(f"POST {self.url}/v1/completions: {seen.error}")
        return started, seen

    async def prefill(self, prompt: str) -> tuple[int, float]:
        """(prompt tokens as the server's usage counts them, seconds) of one non-streamed 1-token answer."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        started = self.clock()
        try:
            response = await self.client.post(self.url + "/v1/completions", json=body)
        except httpx.HTTPError as exc:
            raise EndpointError(f"POST {self.url}/v1/completions: {type(exc).__name__}: {exc}") from None
        seconds = self.clock() - started
        try:
            tokens = int(response.json()["usage"]["prompt_tokens"])
        except (ValueError, KeyError, TypeError):
            raise EndpointError(f"POST {self.url}/v1/completions answered {response.status_code} without usage "
                                f"({response.text[:200]})") from None  # fmt: skip
        return tokens, seconds

    async def timing(self, prompt: str, max_tokens: int) -> StreamTiming:
        started, seen = await self.complete(prompt, max_tokens, stream=True)
        if seen.ttft_s is None or not seen.completion_tokens:
            raise EndpointError("a streamed completion carried no output tokens")
        first = started + seen.ttft_s
        return StreamTiming(first, first + (seen.tpot_s or 0.0) * (seen.completion_tokens - 1), seen.completion_tokens)


async def _served_model(client: httpx.AsyncClient, url: str) -> tuple[str, int]:
    """(the first model GET /v1/models lists, its max_model_len where the server says: vLLM does)."""
    try:
        response = await client.get(url.rstrip("/") + "/v1/models")
    except httpx.HTTPError as exc:
        raise EndpointError(f"cannot reach {url}: {type(exc).__name__}: {exc}") from None
    if response.status_code in (401, 403):
        raise EndpointError(f"GET {url}/v1/models answered {response.status_code}: give its key (--api-key)")
    if response.status_code != 200:
        raise EndpointError(f"GET {url}/v1/models answered {response.status_code}: pass --model NAME")
    try:
        card = response.json()["data"][0]
        return str(card["id"]), int(card.get("max_model_len") or 0)
    except (ValueError, KeyError, IndexError, TypeError):
        raise EndpointError(f"GET {url}/v1/models lists no model: pass --model NAME") from None


async def _measure(
    client: httpx.AsyncClient, url: str, model: str | None, concurrency: Sequence[int], prompt_tokens: int,
    long_prompt_tokens: int, new_tokens: int, saturation: float, clock: Callable[[], float],
    progress: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    listed, max_model_len = await _served_model(client, url)
    endpoint = _Endpoint(client, url, model or listed, clock)
    prompts = _Prompts()
    await endpoint.timing(prompts.take(prompt_tokens), 4)  # warm-up (and: does it stream at all?)
    ttfts = []
    for _ in range(5):
        _, seen = await endpoint.complete(prompts.take(prompt_tokens), 1, stream=True)
        ttfts.append(seen.ttft_s)
    progress(f"TTFT p50 {statistics.median(ttfts) * 1000:.1f} ms")
    long_tokens, seconds = await endpoint.prefill(prompts.take(long_prompt_tokens))
    prefill = long_tokens / seconds
    progress(f"prefill {prefill:.0f} tokens/s ({long_tokens}-token prompt)")
    decode: dict[int, float] = {}
    for level in sorted(set(concurrency)):
        timings = await asyncio.gather(
            *(endpoint.timing(prompts.take(prompt_tokens), new_tokens) for _ in range(level))
        )
        decode[level] = decode_rate(timings)
        progress(f"decode at concurrency {level}: {decode[level]:.1f} tokens/s")
        rates = list(decode.values())
        if len(rates) >= 2 and rates[-1] < rates[-2] * (1 + saturation):
            break  # saturated: more concurrency only queues
    return {"model": endpoint.model, "ttft": statistics.median(ttfts), "prefill": prefill, "decode": decode,
            "max_model_len": max_model_len, "ignore_eos": endpoint.ignore_eos}  # fmt: skip


def measure_endpoint(
    url: str,
    model: str | None = None,
    *,
    concurrency: Sequence[int] = (1, 4, 8, 16, 32),
    prompt_tokens: int = 64,
    long_prompt_tokens: int = 384,
    new_tokens: int = 64,
    saturation: float = 0.05,
    cold_start_s: float = 0.0,
    hardware: str = "",
    api_key: str | None = None,
    timeout_s: float = 300.0,
    transport: httpx.AsyncBaseTransport | None = None,
    clock: Callable[[], float] = time.perf_counter,
    progress: Callable[[str], None] = lambda line: None,
) -> Profile:
    """Measure the server at `url` (its base, without /v1) as a Profile (see the module's docstring)."""
    if not concurrency or min(concurrency) < 1:
        raise ValueError("concurrency levels must be positive integers")
    headers = {"authorization": f"Bearer {api_key}"} if api_key else None

    async def run() -> dict[str, Any]:
        async with httpx.AsyncClient(transport=transport, timeout=timeout_s, headers=headers) as client:
            return await _measure(client, url, model, concurrency, prompt_tokens, long_prompt_tokens, new_tokens,
                                  saturation, clock, progress)  # fmt: skip

    got = asyncio.run(run())
    decode = got["decode"]
    return Profile(
        recipe=f"external:{got['model']}",
        hardware=hardware or f"endpoint {url}",
        model=got["model"],
        weight_bytes=0,
        kv_bytes_per_token=0,
        max_slots=max(decode),
        decode_tokens_per_s=decode,
        prefill_tokens_per_s=got["prefill"],
        ttft_s_p50=got["ttft"],
        cold_start_s=cold_start_s,
        max_model_len=got["max_model_len"],
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        extra={
            "method": "black-box",
            "endpoint": url,
            "prompt_tokens": prompt_tokens,
            "new_tokens": new_tokens,
            "ignore_eos": got["ignore_eos"],
        },
        source="measured",
        source_note=(
            f"measured black-box over HTTP at {url} (tandem profile --endpoint): decode by concurrency, prefill, "
            "TTFT; weights, KV bytes and budget unknown (0)"
            + (f"; cold start {cold_start_s:g} s as given" if cold_start_s else "; cold start not measured (0)")
        ),
    )


def profile_endpoint_cli(url: str, model: str | None, concurrency: str, cold_start_s: float, hardware: str | None,
                         api_key: str | None, echo: Callable[[str], None]) -> Profile:  # fmt: skip
    """`tandem profile --endpoint`: parse the flags' text, measure, and turn failures into ValueError lines."""
    try:
        levels = tuple(sorted({int(c) for c in concurrency.split(",")}))
        if not levels or min(levels) < 1:
            raise ValueError
    except ValueError:
        raise ValueError("--concurrency: a comma-separated list of positive integers") from None
    try:
        return measure_endpoint(url, model, concurrency=levels, cold_start_s=cold_start_s, hardware=hardware or "",
                                api_key=api_key, progress=echo)  # fmt: skip
    except EndpointError as exc:
        raise ValueError(str(exc)) from None
