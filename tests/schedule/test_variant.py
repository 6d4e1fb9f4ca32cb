"""A Variant's replica spec: what each replica reserves on a node, from its Profile or as given."""

from __future__ import annotations

from tandem.schedule.variant import DEFAULT_KV_CACHE_TOKENS, REPLICA_RUNTIME_BYTES, Variant, replica_memory_bytes

from .helpers import profile


def test_memory_follows_the_profile_weights_kv_budget_and_runtime():
    measured = profile({1: 20.0})
    expected = measured.weight_bytes + measured.kv_bytes_per_token * DEFAULT_KV_CACHE_TOKENS + REPLICA_RUNTIME_BYTES
    assert replica_memory_bytes(measured) == expected
    assert replica_memory_bytes(measured, 1024) == expected - measured.kv_bytes_per_token * (32768 - 1024)
    assert Variant("fast", "int8", profile=measured).spec("eu").memory_bytes == expected


def test_given_memory_wins_and_without_either_nothing_is_reserved():
    measured = profile({1: 20.0})
    assert Variant("fast", "int8", profile=measured, memory_bytes=1 << 30).replica_memory == 1 << 30
    assert Variant("fast", "int8").spec().memory_bytes == 0


def test_the_spec_carries_accelerators_and_the_region():
    spec = Variant("fast", "int8", threads=2, accelerators=1, accelerator_type="A100").spec("eu")
    assert (spec.region, spec.threads, spec.accelerators, spec.accelerator_type) == ("eu", 2, 1.0, "A100")
