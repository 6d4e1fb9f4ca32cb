"""The offline gate: both variants as local replica processes, the bench's trace-shaped workload
sent to both, the same mirror, scoring and judgement as the live gate.

The workload is `tandem bench`'s (tandem.workload: lengths drawn from the Azure conversation trace
and scaled to the model's context, prompt text from held-out code), tokenized here with the
`tokenizers` library (no torch). Every request streams (TTFT and time per output token need it),
asks for one logprob per token (the shared-prefix fallback needs them where the servers refuse
`echo`) and ignores EOS, so both variants write the trace's output lengths.

The incumbent is driven as a client would (`concurrency` requests in flight); the ShadowMirror
sends each one's copy to the candidate at once, as the gateway does with live traffic. Accuracy
is scored after the last pair, so scoring requests never load the servers while latency is
measured. A few warm-up requests first pay each replica's one-time costs outside the evidence.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from tandem.cluster.backend import Backend, Replica, ReplicaSpec, ReplicaState
from tandem.cluster.local import LocalBackend, popen_spawner
from tandem.data.bundled import bundled_model_dir
from tandem.gate.mirror import ShadowMirror
from tandem.gate.pairs import Pair
from tandem.gate.scoring import COMPLETIONS, Scorer
from tandem.measure.observation import observe
from tandem.workload import load_workload

__all__ = ["GateRunError", "OfflineRun", "PairRun", "run_pairs", "start_replicas", "stop_replicas", "workload_bodies"]

logger = logging.getLogger("tandem.gate")

_CONTEXT_MARGIN = 8  # tokens kept free: a decoded prompt can re-tokenize a little longer, plus BOS


class GateRunError(RuntimeError):
    """The offline gate could not run (a replica that would not start, a model without a tokenizer)."""


@dataclass(frozen=True)
class OfflineRun:
    incumbent: str  # recipes
    candidate: str
    model: str | None = None  # None: the bundled model
    requests: int = 200
    concurrency: int = 4
    seed: int = 0
    temperature: float = 0.0
    threads: int | None = None  # torch threads per replica (None: half the cores each)
    trace: Path | None = None
    warmup: int = 4
    start_timeout_s: float = 300.0
    request_timeout_s: float = 300.0

    @property
    def model_dir(self) -> Path:
        return Path(self.model) if self.model else bundled_model_dir()


class _Tokens:
    """tokenizer.json through `tokenizers`, with the encode() tandem.workload expects."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        path = model_dir / "tokenizer.json"
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises plain Exceptions for missing or bad files
            raise GateRunError(f"{path}: cannot load the tokenizer ({exc})") from None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def _context_length(model_dir: Path) -> int:
    path = model_dir / "config.json"
    try:
        return int(json.loads(path.read_text())["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise GateRunError(f"{path}: cannot read max_position_embeddings ({exc})") from None


def workload_bodies(run: OfflineRun, served_model: str) -> list[dict[str, Any]]:
    """The requests both variants get: completions bodies with the bench's lengths and prompts."""
    tokens = _Tokens(run.model_dir)
    context = _context_length(run.model_dir)
    try:
        requests = load_workload(tokens, context - _CONTEXT_MARGIN, run.requests, seed=run.seed, trace=run.trace)
    except (OSError, ValueError) as exc:
        raise GateRunError(str(exc)) from None
    bodies = []
    for i, request in enumerate(requests):
        body: dict[str, Any] = {
            "model": served_model,
            "prompt": tokens.decode(request.prompt_ids),
            "max_tokens": request.max_tokens,
            "temperature": run.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": 1,
            "ignore_eos": True,
        }
        if run.temperature > 0:
            body["seed"] = run.seed * 100_003 + i  # the same seed on both sides
        bodies.append(body)
    return bodies


# --- replicas -------------------------------------------------------------------------------------
def start_replicas(
    backend: Backend,
    specs: Sequence[ReplicaSpec],
    *,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Replica]:
    """Start one replica per spec and wait until all answer ready; GateRunError with the log if one dies."""
    started = [backend.start(spec) for spec in specs]
    deadline = clock() + timeout_s
    waiting = {r.replica_id: r for r in started}
    while waiting:
        for replica_id in list(waiting):
            if backend.health(replica_id):
                del waiting[replica_id]
        exited = [e for e in backend.exits() if e.replica.replica_id in waiting]
        if exited:
            dead = exited[0]
            said = f": {dead.error}" if dead.error else ""
            raise GateRunError(
                f"the {dead.replica.spec.recipe} replica exited (code {dead.code}) before it was ready{said}"
            )
        if waiting and clock() > deadline:
            raise GateRunError(f"replicas {', '.join(sorted(waiting))} were not ready within {timeout_s:g} s")
        if waiting:
            sleep(0.25)
    return [next(r for r in backend.list() if r.replica_id == s.replica_id) for s in started]


def stop_replicas(backend: Backend, *, clock=time.monotonic, sleep=time.sleep, grace_s: float = 60.0) -> None:
    """SIGTERM every replica and wait for the processes to exit (a straggler is killed by the backend)."""
    for replica in backend.list():
        backend.stop(replica.replica_id)
    deadline = clock() + grace_s
    while getattr(backend, "stopping", None) and clock() < deadline:
        sleep(0.1)


# --- the pairs ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PairRun:
    pairs: tuple[Pair, ...]
    mirror: dict[str, int]
    teacher_forcing_off: str | None
    seconds: float


async def _score(pairs: list[Pair], scorer: Scorer, bodies: dict[str, dict], urls: tuple[str, str], limit: int):
    gate = asyncio.Semaphore(limit)

    async def one(pair: Pair) -> Pair:
        if not pair.comparable:
            return pair
        async with gate:
            agreement, note = await scorer.agreement(
                pair.path, bodies[pair.request_id], pair.incumbent, pair.candidate,
                incumbent_url=urls[0], candidate_url=urls[1], greedy=pair.sampling.greedy,
            )  # fmt: skip
        return replace(pair, agreement=agreement, note=note)

    # The first pair alone: it tells whether the servers take echo before the rest are sent.
    head = [await one(pairs[0])] if pairs else []
    return head + list(await asyncio.gather(*(one(p) for p in pairs[1:])))


async def run_pairs(
    bodies: Sequence[dict[str, Any]],
    client: httpx.AsyncClient,
    incumbent_url: str,
    candidate_url: str,
    *,
    concurrency: int,
    warmup: int = 0,
    clock: Callable[[], float] = time.monotonic,
) -> PairRun:
    """Send every body to the incumbent (`concurrency` at a time) and, through the mirror, to the candidate."""
    started = clock()
    recorded: list[Pair] = []
    mirror = ShadowMirror(
        client, candidate_url=lambda: candidate_url, incumbent_url=lambda: incumbent_url, record=recorded.append,
        fraction=1.0, queue_size=max(1, len(bodies)), concurrency=concurrency, clock=clock, score=False,
    )  # fmt: skip
    headers = {"content-type": "application/json"}
    for body in list(bodies)[:warmup]:  # one-time costs (first allocations, thread pools) outside the evidence
        warm = json.dumps({**body, "max_tokens": 4}).encode()
        await asyncio.gather(
            *(observe(client, url + COMPLETIONS, warm, headers=headers, clock=clock, stream=True)
              for url in (incumbent_url, candidate_url))
        )  # fmt: skip
    mirror.start()
    slots = asyncio.Semaphore(concurrency)
    by_id: dict[str, dict] = {}

    async def one(index: int, body: dict[str, Any]) -> None:
        async with slots:
            raw = json.dumps(body).encode()
            # A UUID: some servers refuse any other X-Request-ID (llama-cpp-python's answers 400).
            request_id = str(uuid.UUID(int=index))
            by_id[request_id] = body
            ticket = mirror.offer(COMPLETIONS, raw, {**headers, "x-request-id": request_id})
            observation = await observe(
                client, incumbent_url + COMPLETIONS, raw, headers=headers, clock=clock, stream=True
            )
            if ticket is not None:
                ticket.incumbent_done(observation)

    try:
        await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))
        await mirror.drain()
    finally:
        await mirror.aclose()
    recorded.sort(key=lambda p: uuid.UUID(p.request_id).int)
    scorer = Scorer(client)
    scored = await _score(recorded, scorer, by_id, (incumbent_url, candidate_url), concurrency)
    counts = Counter(mirror.counts)
    counts["teacher_forced"], counts["scoring_failures"] = scorer.teacher_forced, scorer.failures
    counts["scoring_mismatches"] = scorer.mismatches
    return PairRun(tuple(scored), dict(counts), scorer.unsupported, clock() - started)


def served_model_name(client: httpx.Client, url: str) -> str:
    try:
        return client.get(url + "/v1/models").json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise GateRunError(f"{url}/v1/models did not name the served model ({exc})") from None


def run_variants(
    run: OfflineRun,
    *,
    log_dir: Path | None = None,
    backend: Backend | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> PairRun:
    """Start both variants, run the workload through them, stop them."""
    import os

    threads = run.threads or max(1, (os.cpu_count() or 2) // 2)  # two replicas share the machine's cores
    logs = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="tandem-gate-"))
    backend = backend or LocalBackend(spawn=popen_spawner(logs), kill_after_s=30.0)
    specs = [
        ReplicaSpec(variant=name, recipe=recipe, model=run.model, threads=threads)
        for name, recipe in (("incumbent", run.incumbent), ("candidate", run.candidate))
    ]
    try:
        incumbent, candidate = start_replicas(backend, specs, timeout_s=run.start_timeout_s)
        assert incumbent.state is ReplicaState.READY and candidate.state is ReplicaState.READY
        with httpx.Client(timeout=30.0) as sync_client:
            bodies = workload_bodies(run, served_model_name(sync_client, incumbent.url))

        async def drive() -> PairRun:
            timeout = httpx.Timeout(connect=10.0, read=run.request_timeout_s, write=30.0, pool=None)
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=4 * run.concurrency)
            async with httpx.AsyncClient(transport=transport, timeout=timeout, limits=limits) as client:
                return await run_pairs(
                    bodies, client, incumbent.url, candidate.url, concurrency=run.concurrency, warmup=run.warmup
                )

        return asyncio.run(drive())
    finally:
        stop_replicas(backend)
