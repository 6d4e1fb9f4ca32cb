"""The gate's state machine: shadowing, verdicts at checkpoints, promotion through an injected callable."""

import json
from dataclasses import replace

import pytest

from tandem.gate.config import GateConfig
from tandem.gate.pairs import PairLog
from tandem.gate.sides import Side
from tandem.gate.state import Gate, GateState, checkpoints

from .helpers import obs, pair, profile
from .test_evidence import BASE, FAST, good_pairs

CONFIG = GateConfig(
    candidate="fast", min_latency_samples=40, min_accuracy_samples=30, min_error_samples=20, max_samples=400,
    deadline_s=600.0,
)  # fmt: skip


def make(config=CONFIG, promote=None, cand_profile=FAST, records=None):
    log = PairLog()
    gate = Gate(
        config, incumbent=Side("baseline", BASE), candidate=Side("fast", cand_profile), pairs=log, started_at=0.0,
        promote=promote, record=None if records is None else records.append,
    )  # fmt: skip
    return gate, log


def test_checkpoints_double_from_the_largest_minimum():
    assert checkpoints(CONFIG) == (40, 80, 160, 320, 400)
    gate, _ = make()
    assert gate.looks == 6 and gate.look_config.confidence == pytest.approx(1 - 0.05 / 6)


def test_pass_promotes_through_the_injected_callable():
    promoted, records = [], []
    gate, log = make(promote=promoted.append, records=records)
    pairs = good_pairs(40)
    for p in pairs[:39]:
        log.add(p)
        assert gate.evaluate(1.0) is None and gate.shadowing  # before the first checkpoint: no judgement
    log.add(pairs[39])
    decision = gate.evaluate(2.0)
    assert promoted == ["fast"] and gate.state is GateState.DONE and decision.after is GateState.DONE
    assert [(d.before, d.after) for d in gate.decisions] == [
        (GateState.SHADOWING, GateState.PASSED), (GateState.PASSED, GateState.PROMOTING),
        (GateState.PROMOTING, GateState.DONE),
    ]  # fmt: skip
    assert records == gate.decisions and not gate.shadowing
    record = json.loads(json.dumps(gate.decisions[0].to_dict()))
    assert record["verdict"]["metrics"]["latency"]["verdict"] == "PASS" and record["evidence"]["pairs"] == 40
    assert gate.evaluate(3.0) is None  # a finished gate stays finished


def test_without_auto_promote_an_operator_promotes():
    promoted = []
    gate, log = make(config=replace(CONFIG, auto_promote=False), promote=promoted.append)
    with pytest.raises(ValueError, match="only after a PASS"):
        gate.promote_now(0.0)
    for p in good_pairs(40):
        log.add(p)
    gate.evaluate(1.0)
    assert gate.state is GateState.PASSED and promoted == []
    gate.promote_now(2.0)
    assert gate.state is GateState.DONE and promoted == ["fast"]


def test_fail_stops_shadowing_and_never_promotes():
    promoted = []
    dear = profile("fast", {1: 5.0, 32: 100.0})
    gate, log = make(promote=promoted.append, cand_profile=dear)
    for p in good_pairs(40):
        log.add(p)
    gate.evaluate(1.0)
    assert gate.state is GateState.FAILED and not gate.shadowing and promoted == []


def test_errors_fail_at_once_between_checkpoints():
    gate, log = make(promote=lambda _: pytest.fail("must not promote"))
    log.add(pair(0, cand=obs(error="HTTP 500", status=500)))
    decision = gate.evaluate(1.0)
    assert gate.state is GateState.FAILED and "failed errors" in decision.reason


def test_inconclusive_keeps_shadowing_until_the_deadline_then_nothing_switches():
    gate, log = make(promote=lambda _: pytest.fail("must not promote"))
    for i in range(40):
        log.add(pair(i))  # equal latencies, no token evidence: inconclusive
    assert gate.evaluate(1.0) is None and gate.state is GateState.SHADOWING
    assert gate.verdict.verdict == "INCONCLUSIVE"
    decision = gate.evaluate(600.0)
    assert gate.state is GateState.INCONCLUSIVE and decision.reason.startswith("deadline")


def test_a_final_look_decides_and_max_samples_ends_shadowing():
    gate, log = make(config=replace(CONFIG, deadline_s=None))
    for i in range(10):
        log.add(pair(i))
    gate.evaluate(5.0, final=True)
    assert gate.state is GateState.INCONCLUSIVE
    gate, log = make(config=replace(CONFIG, max_samples=40, deadline_s=None))
    for i in range(40):
        log.add(pair(i))
    gate.evaluate(5.0)
    assert gate.state is GateState.INCONCLUSIVE


def test_fail_closed_when_the_judge_or_the_promotion_breaks():
    def broken(_):
        raise RuntimeError("rollout refused")

    gate, log = make(promote=broken)
    for p in good_pairs(40):
        log.add(p)
    gate.evaluate(1.0)
    assert gate.state is GateState.FAILED and "promotion failed" in gate.decisions[-1].reason

    gate, log = make()
    log.add(pair(0))
    gate.evidence = lambda: (_ for _ in ()).throw(ValueError("bad evidence"))  # a bug in the evidence
    gate.evaluate(1.0, final=True)
    assert gate.state is GateState.FAILED and "could not judge" in gate.decisions[-1].reason


def test_a_failing_record_sink_does_not_stop_the_gate():
    def full_disk(_):
        raise OSError("no space left")

    gate = Gate(CONFIG, incumbent=Side("b", BASE), candidate=Side("f", FAST), pairs=PairLog(), started_at=0.0,
                record=full_disk)  # fmt: skip
    gate.evaluate(0.0, final=True)
    assert gate.state is GateState.INCONCLUSIVE and len(gate.decisions) == 1


def test_snapshot_for_the_admin_api():
    gate, log = make()
    for p in good_pairs(40):
        log.add(p)
    gate.evaluate(1.0)
    snap = json.loads(json.dumps(gate.snapshot()))
    assert snap["state"] == "done" or snap["state"] == "passed"
    assert snap["samples"] == 40 and snap["verdict"]["verdict"] == "PASS" and snap["next_checkpoint"] == 80
