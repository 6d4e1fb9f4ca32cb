"""Shadow traffic in the gateway: the thin shell around tandem.gate (which holds every decision).

A deployment with a `gate:` block (or `tandem serve --shadow RECIPE`) gets one `GatewayShadow`:
- the ShadowMirror: while the gate shadows, a sampled `fraction` of live completions and chat
  requests (streamed or not) is copied, with the client's sampling parameters, to a ready replica
  of the candidate variant, through a bounded queue (full: the copy is dropped and counted). It
  runs beside the incumbent and never delays the client's answer; the client only ever gets the
  incumbent's. Copies go straight to the candidate's replicas, never through the Dispatcher, so
  they count against no breaker, no in-flight estimate and none of the client-facing metrics;
  a copy that fails is the candidate's error, never the client's;
- it is one of the gateway's observers (tandem.gateway.observers): a mirrored request gets a
  request observer the proxy reports the incumbent's answer to as it relays it (per attempt: a
  retried request is timed from its last attempt), which hands the incumbent's Observation to the
  mirror once the client has it all, or cancels the mirror when the client left. The proxy has no
  shadow code. A mirrored completion picked for accuracy scoring (a random `accuracy.score_fraction`
  of the pairs) that a replica keeps a track of (tandem.edge.keep_track, the one rule) also asks
  the incumbent's replica to keep its own logprobs: the gate's scoring then costs that
  client-facing replica no second prefill (tandem.gate.scoring). The replica's answer says whether
  it kept one; where it did not, the pair is scored by an echo on the incumbent;
- `tick(now)`, after each Controller.tick (in the control loop's thread): `Gate.evaluate`. On
  PASS with auto_promote the gate calls `Controller.use(candidate)` (the rollout: zero failed
  requests); FAIL and INCONCLUSIVE stop shadowing, keep the incumbent and retire the candidate's
  replicas. A candidate whose replicas never start fails the gate.
- Every decision is logged as JSON (and appended to `decisions_file`); `view()` is GET /admin/gate.

Metrics (on the gateway's /metrics): `tandem:gate_state{candidate}` (0 shadowing, 1 passed,
2 failed, 3 inconclusive, 4 promoting, 5 done), `tandem:shadow_requests_total{candidate,outcome}`,
`tandem:gate_decisions_total{candidate,verdict}`.
"""

from __future__ import annotations

import json
import logging
import random
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tandem.edge.keep_track import KEEP_TRACK_HEADER, KEPT_TRACK_HEADER, keeps_track
from tandem.gate.config import GateConfig
from tandem.gate.mirror import ShadowMirror, Ticket
from tandem.gate.pairs import PairLog
from tandem.gate.private_files import open_private
from tandem.gate.scoring import Kept, Scorer
from tandem.gate.sides import Side
from tandem.gate.state import Decision, Gate, GateState
from tandem.gateway.observers import NO_REQUEST_OBSERVER, RequestObserver
from tandem.measure.observation import ResponseRecorder
from tandem.pricing import DEFAULT_PRICE
from tandem.schedule import restarts
from tandem.schedule.controller import Controller
from tandem.schedule.dispatch import Dispatcher
from tandem.schedule.variant import Variant

__all__ = ["GatewayShadow", "STATE_CODES", "OUTCOMES"]

logger = logging.getLogger("tandem.gate")

STATE_CODES = {state: code for code, state in enumerate(GateState)}  # shadowing 0 ... done 5
# The mirror's counts exported as outcomes (tandem.gate.mirror counts them; not_incumbent here).
OUTCOMES = ("mirrored", "dropped", "skipped", "cancelled", "not_incumbent", "no_replica", "paired",
            "candidate_errors", "orphaned", "failed", "unscored")  # fmt: skip
_VERDICT_OF = {GateState.PASSED: "PASS", GateState.FAILED: "FAIL", GateState.INCONCLUSIVE: "INCONCLUSIVE"}
_KEPT_HEADERS = ("accept", "x-request-id")  # not the client's key: replicas get the fleet's secret


def _side(variant: Variant) -> Side:
    price = variant.usd_per_hour if variant.usd_per_hour is not None else DEFAULT_PRICE[0]
    missing = None if variant.profile is not None else "the deployment gives it no Profile"
    return Side(variant.name, variant.profile, price, profile_error=missing)


class _MirroredRequest:
    """One mirrored request's incumbent side: a RequestObserver (tandem.gateway.observers) the proxy
    reports to as it relays the incumbent's answer; per attempt (a retried request is timed from its
    last attempt)."""

    def __init__(self, shadow: GatewayShadow, ticket: Ticket, arrived: float, keep_key: str | None = None) -> None:
        self.shadow, self.ticket, self.keep_key = shadow, ticket, keep_key
        self.recorder = ResponseRecorder(arrived, False)
        self.reported = False
        self.url: str | None = None  # the replica of the current attempt
        self.kept = False  # that replica said it keeps this answer's track (KEPT_TRACK_HEADER)

    def attempt(self, url: str, stream: bool, at: float) -> None:
        if not self.reported:
            self.recorder = ResponseRecorder(at, stream)
            self.url, self.kept = url, False

    def headers(self) -> Mapping[str, str]:
        """What the incumbent's request carries besides the client's: the ask to keep its track."""
        return {KEEP_TRACK_HEADER: self.keep_key} if self.keep_key is not None and not self.reported else {}

    def response(self, status: int, headers: Mapping[str, str], at: float) -> None:
        if not self.reported:
            self.recorder.status(status)
            self.kept = headers.get(KEPT_TRACK_HEADER) == "1"

    def chunk(self, data: bytes, at: float) -> None:
        if not self.reported:
            self.recorder.feed(data, at)

    def done(self, variant: str | None, at: float, error: str | None = None) -> None:
        """The client has the whole answer, served by `variant` (None: the gateway answered itself, which
        is the incumbent's side failing; `error`: a stream broke)."""
        if self.reported:
            return
        self.reported = True
        if variant is not None and variant != self.shadow.incumbent:  # the fallback served it: no pair
            self.shadow.count("not_incumbent")
            self.ticket.cancel()
            return
        kept = Kept(self.url, self.keep_key) if self.kept and self.keep_key and self.url else None
        self.ticket.incumbent_done(self.recorder.finish(at, error), kept)

    def cancelled(self) -> None:
        """The client left before it had the whole answer: abandon the mirror."""
        if not self.reported:
            self.reported = True
            self.ticket.cancel()


class GatewayShadow:
    def __init__(
        self,
        config: GateConfig,
        *,
        controller: Controller,
        dispatcher: Dispatcher,
        variants: Mapping[str, Variant],
        clock: Callable[[], float],
        registry: CollectorRegistry | None = None,
        pairs_file: Path | None = None,
        decisions_file: Path | None = None,
        sample: Callable[[], float] | None = None,
    ) -> None:
        self.config, self.controller, self.dispatcher, self.clock = config, controller, dispatcher, clock
        self.incumbent, self.candidate = controller.primary, config.candidate
        self.decisions_file = decisions_file
        self._pairs_out = open_private(pairs_file, buffering=1) if pairs_file is not None else None
        self.pairs = PairLog(sink=self._pairs_out.write if self._pairs_out is not None else None)
        self.counts: Counter[str] = Counter({name: 0 for name in OUTCOMES})
        self.verdicts: Counter[str] = Counter()
        self.sample = sample or random.Random().random
        self.mirror: ShadowMirror | None = None  # made on the event loop (start), with the gateway's client
        self.scorer: Scorer | None = None
        self._write = threading.Lock()
        self.gate = Gate(
            config, incumbent=_side(variants[self.incumbent]), candidate=_side(variants[self.candidate]),
            pairs=self.pairs, started_at=clock(), promote=self._promote, record=self._record,
            mirror_counts=lambda: dict(self.counts),
            teacher_forcing_off=lambda: self.scorer.unsupported if self.scorer is not None else None,
        )  # fmt: skip
        if registry is not None:
            registry.register(_GateCollector(self))

    # --- the event loop's side -----------------------------------------------------------------
    def start(self, client: httpx.AsyncClient) -> None:
        """Start mirroring through `client` (the gateway's: it carries the fleet's secret)."""
        self.scorer = Scorer(client)
        self.mirror = ShadowMirror(
            client, candidate_url=lambda: self._url(self.candidate), incumbent_url=lambda: self._url(self.incumbent),
            record=self.pairs.add, fraction=self.config.fraction, queue_size=self.config.shadow_queue,
            concurrency=self.config.shadow_concurrency, enabled=self.shadowing, sample=self.sample,
            clock=self.clock, scorer=self.scorer,
            score_fraction=self.config.score_fraction,
        )  # fmt: skip
        self.mirror.counts = self.counts  # one set of counts, every outcome present (read from other threads)
        self.mirror.start()

    async def aclose(self) -> None:
        if self.mirror is not None:
            await self.mirror.aclose()
        if self._pairs_out is not None:
            self._pairs_out.close()

    def shadowing(self) -> bool:
        """Mirror now: the gate is shadowing, the incumbent serves alone, and a candidate replica is ready."""
        rollout = self.controller.rollout
        return (
            self.gate.shadowing
            and self.controller.primary == self.incumbent
            and (rollout is None or rollout.finished)
            and self._url(self.candidate) is not None
        )

    def request(self, path: str, payload: Any, headers: Mapping[str, str]) -> RequestObserver:
        """The gateway's Observer: a mirrored request's observer, or NO_REQUEST_OBSERVER. Returns at once."""
        if self.mirror is None or not isinstance(payload, dict):
            return NO_REQUEST_OBSERVER
        kept = {k: v for k, v in headers.items() if k.lower() in _KEPT_HEADERS}
        ticket = self.mirror.offer(path, payload, kept)
        if ticket is None:
            return NO_REQUEST_OBSERVER
        keeps = ticket.scored and keeps_track(
            path, prompt=payload.get("prompt"), n=payload.get("n"), logprobs=payload.get("logprobs"),
            echo=payload.get("echo"),
        )  # fmt: skip
        return _MirroredRequest(self, ticket, self.clock(), secrets.token_urlsafe(16) if keeps else None)

    def count(self, outcome: str) -> None:
        self.counts[outcome] += 1

    def _url(self, variant: str) -> str | None:
        """The least busy ready replica of `variant`, by the gateway's own estimate of loads."""
        loads = [load for load in self.dispatcher.loads(variant) if load.healthy]
        if not loads:
            return None
        best = min(loads, key=lambda load: load.running + load.waiting).replica_id
        return next((r.url for r in self.dispatcher.backend.list() if r.replica_id == best), None)

    # --- the control loop's side (a worker thread) ---------------------------------------------
    def tick(self, now: float) -> Decision | None:
        """Judge if it is time; act on a decision that stops shadowing. Blocking: call it off the loop."""
        history = self.controller.starts.get(self.candidate)
        if (
            self.gate.shadowing
            and history is not None
            and not history.ever_ready
            and restarts.gave_up(history, self.controller.config.start_attempts)
        ):
            decision = self.gate.abandon(now, f"the candidate's replicas failed to start: {history.last_error}")
        else:
            decision = self.gate.evaluate(now)
        if decision is not None and self.gate.state in (GateState.FAILED, GateState.INCONCLUSIVE):
            self._retire()
        return decision

    def promote_now(self, now: float) -> Decision:
        """An operator's go after a PASS without auto_promote (ValueError otherwise)."""
        return self.gate.promote_now(now)

    def _promote(self, name: str) -> None:
        variant = next(p.variant for p in self.controller.snapshot().pools.values() if p.variant.name == name)
        self.controller.use(variant)

    def _retire(self) -> None:
        try:
            self.controller.retire(self.candidate)
        except ValueError as exc:  # a rollout took it over meanwhile: it is not ours to stop
            logger.warning("the gate's candidate stays: %s", exc)

    def _record(self, decision: Decision) -> None:
        verdict = _VERDICT_OF.get(decision.after)
        if verdict is not None:
            self.verdicts[verdict] += 1
        line = json.dumps({"gate_decision": {"candidate": self.candidate, **decision.to_dict()}}, default=str)
        logger.info("%s", line)
        if self.decisions_file is not None:
            with self._write, open_private(self.decisions_file) as out:
                out.write(line + "\n")

    # --- what operators see --------------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        """GET /admin/gate: the gate's snapshot, its settings, the mirror's queue and any rollout it started."""
        out = self.gate.snapshot()
        rollout = self.controller.rollout
        out.update(
            fraction=self.config.fraction,
            auto_promote=self.config.auto_promote,
            queued=self.mirror.pending if self.mirror is not None else 0,
            rollout=None if rollout is None else {"old": rollout.old, "new": rollout.new, "phase": str(rollout.phase)},
            config=asdict(self.config),
            scoring=None if self.scorer is None else _scoring_counts(self.scorer),
        )
        return out


def _scoring_counts(scorer: Scorer) -> dict[str, int]:
    """How the pairs were scored: teacher-forced (of which with the incumbent's kept track), failures."""
    return {
        "teacher_forced": scorer.teacher_forced, "incumbent_kept_track": scorer.kept,
        "incumbent_echoed": scorer.teacher_forced - scorer.kept, "kept_track_missed": scorer.kept_missed,
        "failures": scorer.failures, "mismatches": scorer.mismatches,
    }  # fmt: skip


class _GateCollector:
    """The gate's metrics, read from the shell at scrape time."""

    def __init__(self, shadow: GatewayShadow) -> None:
        self.shadow = shadow

    def collect(self):  # type: ignore[no-untyped-def]
        s = self.shadow
        state = GaugeMetricFamily(
            "tandem:gate_state",
            "The validation gate: 0 shadowing, 1 passed, 2 failed, 3 inconclusive, 4 promoting, 5 done.",
            labels=("candidate",),
        )
        state.add_metric((s.candidate,), STATE_CODES[s.gate.state])
        requests = CounterMetricFamily(
            "tandem:shadow_requests", "Mirrored requests to the candidate, by outcome.", labels=("candidate", "outcome")
        )
        for outcome in OUTCOMES:
            requests.add_metric((s.candidate, outcome), s.counts[outcome])
        decisions = CounterMetricFamily(
            "tandem:gate_decisions", "The gate's verdicts that ended shadowing or a promotion.",
            labels=("candidate", "verdict"),
        )  # fmt: skip
        for verdict in ("PASS", "FAIL", "INCONCLUSIVE"):
            decisions.add_metric((s.candidate, verdict), s.verdicts[verdict])
        return [state, requests, decisions]
