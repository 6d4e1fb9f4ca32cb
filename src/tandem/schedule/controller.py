"""The controller: the scheduling layer's one impure loop, one `tick()` at a time.

Each tick: account for replicas that ended (a startup failure backs the variant off, see
restarts.py; so does a start that fails before any process exists), probe replicas (a starting one
that answers becomes ready; a ready one that stops answering is replaced), collect `ReplicaLoad`s,
stop drained replicas that have gone idle, step a rollout if one is under way, then for every pool
(a variant and its policy) build a ScaleContext, call the policy, and start or drain replicas to
match. A replica is always drained before it is stopped, and stopped only once it has no request
in flight (or its drain timed out), so a scale-down cuts no in-flight request. If the primary
variant never had a ready replica and failed to start `start_attempts` times in a row, `fatal`
says why (with the replica's own error): the gateway exits rather than crash-loop.

Everything it touches comes in as an argument: the Backend, the clock, the load-collection
function, the demand and buffered-request sources, the metrics. Tests drive `tick()` with a fake
clock and a FakeBackend; the gateway calls it from its own loop (tandem.gateway.app).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tandem.cluster.backend import Backend, BackendError, Replica, ReplicaExit, ReplicaSpec, ReplicaState
from tandem.contracts import ReplicaLoad
from tandem.schedule import restarts
from tandem.schedule.metrics import SchedulerMetrics
from tandem.schedule.placement import pick_victims, region_to_add
from tandem.schedule.policies.context import Policy, PolicyState, ScaleContext, ScaleLimits, TokenDemand
from tandem.schedule.restarts import StartHistory
from tandem.schedule.rollout import DrainVariant, Fleet, Phase, Rollout, StartReplicas, abort, step, weights
from tandem.schedule.scale_decision import ScaleDecision, scale_decision
from tandem.schedule.variant import Variant

__all__ = ["Controller", "ControllerConfig", "Pool", "Snapshot", "TickReport"]

logger = logging.getLogger("tandem.schedule")

LoadCollector = Callable[[Sequence[Replica]], Mapping[str, ReplicaLoad]]


@dataclass(frozen=True)
class Pool:
    """A variant the controller keeps replicas of, and how it sizes them."""

    variant: Variant
    policy_name: str
    policy: Policy
    limits: ScaleLimits
    regions: tuple[str, ...] = ("local",)


@dataclass(frozen=True)
class ControllerConfig:
    drain_timeout_s: float = 120.0  # a draining replica is stopped after this even if still busy
    start_timeout_s: float = 300.0  # a replica not ready after this is stopped (and replaced)
    unhealthy_after: int = 3  # failed probes in a row before a ready replica is replaced
    start_attempts: int = 3  # startup failures in a row before a never-ready variant gives up
    restart_backoff_s: float = 1.0  # wait after the first startup failure; doubles with each one
    restart_backoff_max_s: float = 60.0

    def __post_init__(self) -> None:
        if self.start_attempts < 1 or self.restart_backoff_s < 0 or self.restart_backoff_max_s < 0:
            raise ValueError("start_attempts must be >= 1 and the restart backoffs >= 0")


@dataclass(frozen=True)
class Snapshot:
    """What the controller knows, copied under its lock (for an operator's view, from another thread)."""

    primary: str
    pools: dict[str, Pool]
    starts: dict[str, StartHistory]
    recent_exits: tuple[ReplicaExit, ...]
    rollout: Rollout | None
    replicas: tuple[Replica, ...]
    decisions: dict[str, ScaleDecision] = field(default_factory=dict)  # the last per variant (scale_decision)


@dataclass
class TickReport:
    now: float
    desired: dict[str, tuple[int, int]] = field(default_factory=dict)  # variant -> (current, desired)
    started: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    exited: list[ReplicaExit] = field(default_factory=list)
    rollout: Rollout | None = None


class Controller:
    def __init__(
        self,
        backend: Backend,
        pools: Sequence[Pool],
        clock: Callable[[], float],
        collect_loads: LoadCollector,
        *,
        primary: str | None = None,
        demand: Callable[[str, float], TokenDemand] | None = None,
        buffered: Callable[[str], int] | None = None,
        metrics: SchedulerMetrics | None = None,
        config: ControllerConfig = ControllerConfig(),
    ) -> None:
        if not pools:
            raise ValueError("the controller needs at least one pool")
        self.backend = backend
        self.pools: dict[str, Pool] = {p.variant.name: p for p in pools}
        self.states: dict[str, PolicyState] = {name: PolicyState() for name in self.pools}
        self.primary = primary or pools[0].variant.name
        if self.primary not in self.pools:
            raise ValueError(f"primary variant {self.primary!r} has no pool")
        self.clock = clock
        self.collect_loads = collect_loads
        self.demand = demand or (lambda _variant, _now: TokenDemand())
        self.buffered = buffered or (lambda _variant: 0)
        self.metrics = metrics
        self.config = config
        self.rollout: Rollout | None = None
        self.replicas: list[Replica] = []  # the fleet as of the last tick
        self.loads: dict[str, ReplicaLoad] = {}  # the loads the last tick decided on
        self.starts: dict[str, StartHistory] = {name: StartHistory() for name in self.pools}
        self.recent_exits: deque[ReplicaExit] = deque(maxlen=20)  # unexpected ones, newest last
        self.decisions: dict[str, ScaleDecision] = {}  # each variant's last scaling decision and its inputs
        self.fatal: str | None = None  # set when the primary can never start: the gateway exits
        self._promoted: Pool | None = None  # an existing pool a rollout took over, as it was (restored on abort)
        self._forget_when_empty: str | None = None  # an aborted rollout's own pool, dropped once drained
        self._draining_since: dict[str, float] = {}
        self._probe_failures: Counter[str] = Counter()
        self._lock = threading.Lock()  # one tick at a time; `use` may come from another thread

    # --- what the gateway asks ----------------------------------------------------------------
    def weights(self) -> dict[str, float]:
        """How the primary traffic splits over variants now ({primary: 1.0} outside a rollout)."""
        rollout = self.rollout
        if rollout is not None and not rollout.finished:
            return weights(rollout)
        return {self.primary: 1.0}

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(
                self.primary, dict(self.pools), dict(self.starts), tuple(self.recent_exits), self.rollout,
                tuple(self.replicas), dict(self.decisions),
            )  # fmt: skip

    def use(self, variant: Variant, shift_step: float = 1.0, timeout_s: float = 600.0) -> Rollout:
        """Roll the primary traffic over to `variant`: start new, shift traffic, drain old.

        `variant` may be new, or one that already has a pool (a candidate, the fallback): that pool
        takes the primary's sizing and is grown to the primary's size before any traffic moves.
        """
        with self._lock:
            if self.rollout is not None and not self.rollout.finished:
                raise RuntimeError(f"a rollout {self.rollout.old} -> {self.rollout.new} is under way")
            if variant.name == self.primary:
                raise ValueError(f"{variant.name!r} already serves the primary traffic")
            old = self.pools[self.primary]
            live = sum(1 for r in self.backend.list() if r.variant == self.primary and r.live)
            existed = variant.name in self.pools and variant.name != self._forget_when_empty
            self._promoted = self.pools[variant.name] if existed else None
            self._forget_when_empty = None
            self.pools[variant.name] = replace(old, variant=variant)
            self.states.setdefault(variant.name, self.states[self.primary])
            self.starts.setdefault(variant.name, StartHistory())
            self.rollout = Rollout(
                old=self.primary,
                new=variant.name,
                target=max(live, old.limits.min_replicas, 1),
                started_at=self.clock(),
                shift_step=shift_step,
                timeout_s=timeout_s,
            )
            logger.info("rollout %s -> %s: starting %d replicas", self.primary, variant.name, self.rollout.target)
            return self.rollout

    def retire(self, name: str) -> None:
        """Stop keeping replicas of `name` (a candidate the gate failed): they drain, then stop."""
        with self._lock:
            rollout = self.rollout
            busy = rollout is not None and not rollout.finished and name in (rollout.old, rollout.new)
            if name == self.primary or busy:
                raise ValueError(f"{name!r} serves traffic; it cannot be retired")
            self.pools.pop(name, None)
            self.states.pop(name, None)
            now = self.clock()
            live = [r for r in self.backend.list() if r.variant == name and r.live]
            self._remove(live, now, TickReport(now))
            logger.info("%s retired: %d replicas drain", name, len(live))

    # --- the loop ----------------------------------------------------------------------------
    def tick(self) -> TickReport:
        with self._lock:
            now = self.clock()
            report = TickReport(now)
            self._account_exits(now, report)
            self._probe(now, report)
            replicas = self.backend.list()
            loads = self.collect_loads(replicas)
            self._finish_drains(replicas, loads, now, report)
            replicas = self.backend.list()
            self._step_rollout(replicas, now, report)
            held = self._held()
            for name, pool in list(self.pools.items()):
                if name not in held:
                    self._scale(pool, self.backend.list(), loads, now, report)
            self.replicas = self.backend.list()
            self.loads = dict(loads)
            if self.metrics is not None:
                self.metrics.observe_replicas(self.pools, self.replicas)
            report.rollout = self.rollout
            return report

    # --- steps -------------------------------------------------------------------------------
    def _account_exits(self, now: float, report: TickReport) -> None:
        for ex in self.backend.exits():
            report.exited.append(ex)
            if ex.expected:
                continue
            self._start_ended(ex.replica, now, ex.error or f"exited with code {ex.code}", ex)
        primary = self.starts.get(self.primary, StartHistory())
        if self.fatal is None and restarts.gave_up(primary, self.config.start_attempts):
            self.fatal = (  # the gateway logs it and exits
                f"no replica of the primary variant {self.primary!r} became ready: {primary.failures} failed to "
                f"start; the last said: {primary.last_error}"
            )

    def _start_ended(self, replica: Replica, now: float, error: str, ex: ReplicaExit | None = None) -> None:
        """A replica ended without being asked (or was stopped for not getting ready): count it."""
        variant = replica.variant
        history = self.starts.get(variant, StartHistory())
        if replica.state is ReplicaState.STARTING:
            history = restarts.start_failed(
                history, now, error, self.config.restart_backoff_s, self.config.restart_backoff_max_s
            )
            logger.warning(
                "replica %s of %s failed to start (%d in a row; the next start waits %.0f s): %s",
                replica.replica_id, variant, history.failures, (history.retry_at or now) - now, error,
            )  # fmt: skip
        else:
            history = restarts.crashed(history, error)
        self.starts[variant] = history
        if ex is not None:
            self.recent_exits.append(ex)
        if self.metrics is not None:
            self.metrics.count_restart(variant)

    def _launch_failed(self, spec: ReplicaSpec, exc: Exception, now: float) -> None:
        """A start that failed before a process existed (no free port, a log file that cannot be made):
        a failed start like any other, so it backs off, counts toward giving up, and its error is what
        the operator sees (recent exits, `last_error`, a rollout's abort reason)."""
        if isinstance(exc, BackendError):
            error = str(exc)
        else:  # a backend's own bug: still a failed start, with its traceback in the log once
            error = f"{type(exc).__name__}: {exc}"
            logger.error("starting a replica of %s raised", spec.variant, exc_info=exc)
        replica_id = getattr(exc, "replica_id", None) or "(unnamed)"
        replica = Replica(replica_id, spec, ReplicaState.STARTING, started_at=now)
        self._start_ended(replica, now, error, ReplicaExit(replica, None, expected=False, output=error))

    def _probe(self, now: float, report: TickReport) -> None:
        for replica in self.backend.list():
            if replica.state not in (ReplicaState.STARTING, ReplicaState.READY):
                continue
            if self.backend.health(replica.replica_id):
                self._probe_failures.pop(replica.replica_id, None)
                if replica.state is ReplicaState.STARTING:
                    self.starts[replica.variant] = restarts.became_ready(
                        self.starts.get(replica.variant, StartHistory())
                    )
                continue
            if replica.state is ReplicaState.STARTING:
                if replica.pending is not None and replica.pending.cause == "no-room":
                    continue  # waiting for room is not a slow start: its start timeout counts from placement
                waited = now - replica.started_at
                if waited > self.config.start_timeout_s:
                    self._stop(replica.replica_id, report)
                    why = f" ({replica.pending})" if replica.pending is not None else ""
                    self._start_ended(replica, now, f"not ready after {waited:.0f} s; stopped{why}")
                continue
            self._probe_failures[replica.replica_id] += 1
            if self._probe_failures[replica.replica_id] >= self.config.unhealthy_after:
                logger.warning(
                    "replica %s failed %d probes; replacing it", replica.replica_id, self.config.unhealthy_after
                )
                self._stop(replica.replica_id, report)

    def _finish_drains(
        self, replicas: Sequence[Replica], loads: Mapping[str, ReplicaLoad], now: float, report: TickReport
    ) -> None:
        for replica in replicas:
            if replica.state is not ReplicaState.DRAINING:
                continue
            since = self._draining_since.setdefault(replica.replica_id, now)
            load = loads.get(replica.replica_id)
            idle = load is not None and load.running + load.waiting == 0
            if idle or now - since >= self.config.drain_timeout_s:
                if not idle:
                    logger.warning("replica %s still busy after its drain timeout; stopping it", replica.replica_id)
                self._stop(replica.replica_id, report)

    def _step_rollout(self, replicas: Sequence[Replica], now: float, report: TickReport) -> None:
        rollout = self.rollout
        if rollout is None or rollout.finished:
            return
        new = self.starts.get(rollout.new, StartHistory())
        if rollout.phase is Phase.STARTING and restarts.gave_up(new, self.config.start_attempts):
            self.rollout, actions = abort(rollout, f"{rollout.new} failed to start: {new.last_error}")
        else:
            fleet = Fleet(
                live=Counter(r.variant for r in replicas if r.live),
                ready=Counter(r.variant for r in replicas if r.state is ReplicaState.READY),
                draining=Counter(r.variant for r in replicas if r.state is ReplicaState.DRAINING),
            )
            self.rollout, actions = step(rollout, fleet, now)
        if self.rollout.phase is Phase.ABORTED:
            if self._promoted is not None:
                # The pool existed before the rollout: it keeps its replicas and gets its own sizing back.
                self.pools[rollout.new] = self._promoted
                actions = tuple(a for a in actions if not (isinstance(a, DrainVariant) and a.variant == rollout.new))
            else:
                self._forget_when_empty = rollout.new
            self._promoted = None
        for action in actions:
            pool = self.pools[action.variant]
            if isinstance(action, StartReplicas):
                live = [r for r in replicas if r.variant == action.variant and r.live]
                self._start(pool, live, action.count, now, report)
            elif isinstance(action, DrainVariant):
                victims = [r for r in replicas if r.variant == action.variant and r.live]
                self._remove(victims, now, report)
        if self.rollout.phase is Phase.DONE:
            logger.info("rollout %s -> %s done", self.rollout.old, self.rollout.new)
            self.primary = self.rollout.new
            self.pools.pop(self.rollout.old)
            self.states.pop(self.rollout.old)
            self._promoted = None
        elif self.rollout.phase is Phase.ABORTED:
            logger.warning("rollout %s -> %s aborted: %s", self.rollout.old, self.rollout.new, self.rollout.reason)

    def _held(self) -> set[str]:
        """Pools a rollout controls this tick (their policies wait)."""
        rollout = self.rollout
        if rollout is None:
            return set()
        if rollout.phase is Phase.ABORTED:
            name = self._forget_when_empty  # the aborted rollout's own pool is drained; once empty, forgotten
            if name is None:
                return set()
            if not any(r.variant == name for r in self.backend.list()):
                self.pools.pop(name, None)
                self.states.pop(name, None)
                self._forget_when_empty = None
                return set()
            return {name}
        if rollout.finished:
            return set()
        return {rollout.old, rollout.new}

    def _scale(
        self, pool: Pool, replicas: Sequence[Replica], loads: Mapping[str, ReplicaLoad], now: float, report: TickReport
    ) -> None:
        name = pool.variant.name
        live = [r for r in replicas if r.variant == name and r.live]
        ready = [r for r in live if r.state is ReplicaState.READY]
        ctx = ScaleContext(
            now=now,
            variant=name,
            current_replicas=len(live),
            ready_replicas=len(ready),
            loads=tuple(loads[r.replica_id] for r in ready if r.replica_id in loads),
            limits=pool.limits,
            state=self.states[name],
            demand=self.demand(name, now),
            buffered=self.buffered(name),
            profile=pool.variant.profile,
        )
        desired, self.states[name] = pool.policy(ctx)
        report.desired[name] = (len(live), desired)
        backing_off = desired > len(live) and not restarts.may_start(self.starts.get(name, StartHistory()), now)
        notes = self.states[name].notes
        self.decisions[name] = scale_decision(ctx, pool.policy_name, desired, notes, backing_off)  # for operators
        if desired == len(live) or backing_off:
            return  # backing off after startup failures: the next tick after retry_at starts it
        direction = "up" if desired > len(live) else "down"
        logger.info(
            "%s: %s %d -> %d replicas (%s)", name, pool.policy_name, len(live), desired, dict(self.states[name].notes)
        )
        if self.metrics is not None:
            self.metrics.count_decision(pool.policy_name, direction)
        if desired > len(live):
            self._start(pool, live, desired - len(live), now, report)
        else:
            self._remove(pick_victims(live, loads, len(live) - desired), now, report)

    # --- backend calls -----------------------------------------------------------------------
    def _start(self, pool: Pool, live: Sequence[Replica], count: int, now: float, report: TickReport) -> None:
        if not restarts.may_start(self.starts.get(pool.variant.name, StartHistory()), now):
            return
        placed = list(live)
        for _ in range(count):
            region = region_to_add(pool.regions, placed)
            spec = pool.variant.spec(region)
            try:
                replica = self.backend.start(spec)
            except Exception as exc:  # whatever the cause: counted and backed off, never retried every tick
                self._launch_failed(spec, exc, now)
                return
            placed.append(replica)
            report.started.append(replica.replica_id)

    def _remove(self, victims: Sequence[Replica], now: float, report: TickReport) -> None:
        for replica in victims:
            if replica.state is ReplicaState.STARTING:
                self._stop(replica.replica_id, report)  # it never took a request
            else:
                self.backend.drain(replica.replica_id)
                self._draining_since[replica.replica_id] = now
                report.drained.append(replica.replica_id)

    def _stop(self, replica_id: str, report: TickReport) -> None:
        self.backend.stop(replica_id)
        self._draining_since.pop(replica_id, None)
        self._probe_failures.pop(replica_id, None)
        report.stopped.append(replica_id)
