"""Memory needs (given, from a Profile, estimated from a config) and the choice of replicas to scale down."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from tandem.contracts import Profile, ReplicaLoad
from tandem.schedule.memory import (
    EvictionCandidate,
    Evictions,
    ModelShape,
    choose_evictions,
    estimate_replica_memory,
    memory_need,
    recipe_bits,
)
from tandem.schedule.variant import DEFAULT_KV_CACHE_TOKENS, REPLICA_RUNTIME_BYTES, Variant

MiB = 1 << 20


def bundled_config(name: str) -> dict:
    return json.loads((resources.files("tandem.data") / "models" / name / "config.json").read_text())


def test_a_variants_need_is_given_or_from_its_profile_or_unknown():
    profile = Profile("baseline", "cpu", "m", 1000, 10, 4, {1: 1.0}, 1.0, 0.1, 1.0)
    assert memory_need(Variant("a", "baseline", memory_bytes=123)) == 123
    assert memory_need(Variant("b", "baseline", profile=profile)) == 1000 + 10 * DEFAULT_KV_CACHE_TOKENS + (448 << 20)
    assert memory_need(Variant("c", "baseline")) == 0


def test_the_bundled_targets_shape_and_its_estimate_match_its_measured_kv_and_weights():
    shape = ModelShape.from_config(bundled_config("tandem-code-target"))
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.tied_embeddings) == (8, 2, 64, True)
    base = estimate_replica_memory(shape, "baseline")
    # benchmarks/results/profiles/cpu-baseline.json: kv_bytes_per_token 8192 (float32), kv-bf16: 4096.
    assert base.kv_bytes_per_token == 8192
    assert estimate_replica_memory(shape, "int8+kv-bf16+ngram").kv_bytes_per_token == 4096
    # 15.7 M parameters at float32 (the measured 75.5 MB also counts a packed copy of the tied head).
    assert base.weight_bytes == 15_735_168 * 4
    int8 = estimate_replica_memory(shape, "int8")
    assert int8.weight_bytes == 12_582_912 + (15_735_168 - 12_582_912) * 4  # projections at 1 byte
    assert base.total_bytes == base.weight_bytes + 8192 * DEFAULT_KV_CACHE_TOKENS + REPLICA_RUNTIME_BYTES
    assert int8.total_bytes < base.total_bytes


def test_recipe_bits():
    assert recipe_bits("baseline") == recipe_bits(None) == recipe_bits("ngram")
    assert (recipe_bits("int8+kv-bf16+ngram").linear, recipe_bits("int8+kv-bf16+ngram").kv) == (8, 16)
    assert recipe_bits("bf16") == recipe_bits("bf16+speculative(k=4)")
    assert recipe_bits("bf16").other == 16 and recipe_bits("int4", base_bits=16).linear == 4


def test_a_config_without_its_sizes_is_refused_by_name():
    with pytest.raises(ValueError, match="num_hidden_layers"):
        ModelShape.from_config({"vocab_size": 10, "hidden_size": 8, "num_attention_heads": 2})
    shape = ModelShape.from_config(
        {
            "vocab_size": 10,
            "hidden_size": 8,
            "num_attention_heads": 2,
            "num_hidden_layers": 1,
            "tie_word_embeddings": False,
        }
    )
    assert (shape.kv_heads, shape.head_dim, shape.intermediate_size, shape.embedding_parameters) == (2, 4, 32, 160)


def candidate(rid: str, model: str, mib: int, idle: float, spare: int = 1, node: str = "local") -> EvictionCandidate:
    return EvictionCandidate(rid, model, mib * MiB, idle, spare, node)


def test_the_longest_idle_go_first_and_only_as_many_as_needed():
    candidates = [
        candidate("a-1", "a", 300, idle=50),
        candidate("b-1", "b", 300, idle=900),
        candidate("c-1", "c", 300, idle=10),
    ]
    got = choose_evictions(500 * MiB, {"local": 100 * MiB}, candidates, for_model="new")
    assert got == Evictions("local", ("b-1", "a-1"), 600 * MiB)


def test_never_the_asking_model_never_below_min_never_a_busy_model():
    candidates = [
        candidate("new-1", "new", 900, idle=1000),  # the model asking
        candidate("a-1", "a", 400, idle=800, spare=1),
        candidate("a-2", "a", 400, idle=800, spare=1),  # a may lose one: it keeps its min
        candidate("b-1", "b", 400, idle=5),  # busy a moment ago
        candidate("z-1", "z", 400, idle=900, spare=0),  # at its min
    ]
    assert choose_evictions(500 * MiB, {"local": 0}, candidates, for_model="new", min_idle_s=60) is None
    assert choose_evictions(400 * MiB, {"local": 0}, candidates, for_model="new", min_idle_s=60) == Evictions(
        "local", ("a-1",), 400 * MiB
    )
    assert choose_evictions(700 * MiB, {"local": 0}, candidates, for_model="new").replica_ids == ("a-1", "b-1")


def test_nothing_to_do_when_a_node_has_room_or_the_need_is_unknown():
    candidates = [candidate("a-1", "a", 300, idle=50)]
    assert choose_evictions(200 * MiB, {"local": 300 * MiB}, candidates, for_model="x") is None
    assert choose_evictions(0, {"local": 0}, candidates, for_model="x") is None


def test_across_nodes_the_plan_whose_victims_were_idle_longest_wins():
    candidates = [
        candidate("a-1", "a", 500, idle=100, node="n1"),
        candidate("b-1", "b", 500, idle=700, node="n2"),
        candidate("c-1", "c", 200, idle=800, node="n2"),
        candidate("d-1", "d", 200, idle=900, node="n1"),
    ]
    # n1: d then a (least idle victim 100 s); n2: c then b (least idle 700 s): n2's plan.
    got = choose_evictions(600 * MiB, {"n1": 0, "n2": 0}, candidates, for_model="x")
    assert got == Evictions("n2", ("c-1", "b-1"), 700 * MiB)
    # Bytes on one node never add up with another's: 2 x 500 MiB on two nodes do not hold 900 MiB.
    split = [candidate("a-1", "a", 500, idle=9, node="n1"), candidate("b-1", "b", 500, idle=9, node="n2")]
    assert choose_evictions(900 * MiB, {"n1": 0, "n2": 0}, split, for_model="x") is None


def test_the_controller_waits_for_room_without_counting_a_failed_start_or_starting_more():
    from prometheus_client import CollectorRegistry

    from tandem.cluster import FakeBackend
    from tandem.schedule.controller import Controller, ControllerConfig, Pool
    from tandem.schedule.metrics import SchedulerMetrics
    from tandem.schedule.policies import ScaleLimits

    from .helpers import FakeClock

    clock = FakeClock()
    backend = FakeBackend(clock, memory_bytes=1000 * MiB)
    metrics = SchedulerMetrics(CollectorRegistry())
    wanted = {"big": 1, "other": 1}
    pools = [
        Pool(Variant(name, None, memory_bytes=size * MiB), "scripted", lambda ctx: (wanted[ctx.variant], ctx.state),
             ScaleLimits(min_replicas=0, max_replicas=2))
        for name, size in (("other", 600), ("big", 700))
    ]  # fmt: skip

    def idle(replicas):
        return {r.replica_id: ReplicaLoad(r.replica_id, r.region, r.variant, 0, 0, 0.0, True) for r in replicas}

    controller = Controller(backend, pools, clock, idle, metrics=metrics, config=ControllerConfig(start_timeout_s=30))
    controller.tick()
    (waiting,) = [r for r in backend.list() if r.pending is not None]
    assert waiting.variant == "big" and waiting.pending.cause == "no-room"
    for _ in range(20):  # ten minutes of ticks: past the start timeout, and it is still the one
        clock.advance(30)
        controller.tick()
    assert [r.replica_id for r in backend.list() if r.variant == "big"] == [waiting.replica_id]
    assert controller.starts["big"].failures == 0 and controller.starts["big"].restarts == 0
    sample = metrics.registry.get_sample_value
    assert sample("tandem:replicas_pending", {"variant": "big", "cause": "no-room"}) == 1
    assert sample("tandem:replicas", {"variant": "big", "state": "starting"}) == 1
    wanted["other"] = 0  # the other model scales down: drained, stopped, and the next tick places big's
    for _ in range(3):
        controller.tick()
    (big,) = [r for r in backend.list() if r.variant == "big"]
    assert big.replica_id == waiting.replica_id and big.pending is None
    controller.tick()
    assert [r.state.value for r in backend.list()] == ["ready"]
    assert sample("tandem:replicas_pending", {"variant": "big", "cause": "no-room"}) == 0
