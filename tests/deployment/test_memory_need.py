"""A replica's memory need from its model's config and its recipe, before it starts."""

from __future__ import annotations

from tandem.data.bundled import bundled_draft_dir, bundled_model_dir
from tandem.deployment.memory_need import (
    estimated_replica_bytes,
    fill_replica_memory,
    model_shape,
    recipe_parts,
    replica_bytes_from_args,
)
from tandem.schedule.variant import REPLICA_RUNTIME_BYTES


def test_the_bundled_models_weights_and_kv_from_their_configs():
    shape = model_shape(bundled_model_dir())
    assert shape is not None and (shape.layers, shape.kv_heads, shape.head_dim) == (8, 2, 64)
    baseline = estimated_replica_bytes(None, "baseline", kv_cache_tokens=1)
    params = shape.linear_parameters + shape.embedding_parameters + shape.norm_parameters
    assert baseline == params * 4 + shape.kv_elements_per_token() * 4 + REPLICA_RUNTIME_BYTES  # float32
    assert model_shape("meta-llama/not-here") is None and estimated_replica_bytes("meta-llama/not-here", None) is None


def test_narrower_recipes_need_less_and_a_draft_more():
    need = {r: estimated_replica_bytes(None, r) for r in ("baseline", "bf16", "int8", "int8+kv-bf16", "int4")}
    assert need["baseline"] > need["int8"] > need["int8+kv-bf16"] and need["int8"] > need["int4"]
    assert estimated_replica_bytes(None, None) == need["baseline"]  # the replica's default: never undercounted
    assert need["baseline"] > need["bf16"]
    assert estimated_replica_bytes(None, "speculative(k=4)") > need["baseline"]
    assert estimated_replica_bytes(str(bundled_draft_dir()), "baseline") < need["int8+kv-bf16"]
    assert recipe_parts("int8+speculative(k=4)+kv-bf16") == {"int8", "speculative", "kv-bf16"}


def test_the_replicas_own_flags_set_the_dtype_and_kv_budget():
    small = replica_bytes_from_args(None, "baseline", ["--kv-cache-tokens", "1024", "--dtype=bfloat16"])
    assert small == estimated_replica_bytes(None, "baseline", dtype="bfloat16", kv_cache_tokens=1024)
    raw = {"variants": [{"name": "a"}, {"name": "b", "resources": {"memory": "1GiB"}}, {"name": "c", "profile": {}},
                        {"name": "d", "engine": "external", "command": ["x"]}]}  # fmt: skip
    fill_replica_memory(raw)
    a, b, c, d = raw["variants"]
    assert a["resources"]["memory"] == estimated_replica_bytes(None, None)
    assert b["resources"] == {"memory": "1GiB"} and "resources" not in c and "resources" not in d
