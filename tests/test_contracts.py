"""The cross-layer contract: Profile's later fields (source, accelerators, KV budget) stay backwards compatible."""

import json

import pytest

from tandem.contracts import Profile

OLD = {  # a Profile as `tandem profile` wrote it before source, accelerators and kv_cache_tokens existed
    "recipe": "int8", "hardware": "cpu-2c-avx512", "model": "m", "weight_bytes": 1000, "kv_bytes_per_token": 64,
    "max_slots": 8, "decode_tokens_per_s": {"1": 50.0, "8": 200.0}, "prefill_tokens_per_s": 1000.0,
    "ttft_s_p50": 0.05, "cold_start_s": 3.0, "max_model_len": 512, "measured_at": "2026-01-01T00:00:00+00:00",
    "extra": {"threads": 2},
}  # fmt: skip


def test_an_old_profile_loads_as_measured_on_one_accelerator_with_slot_sized_kv():
    profile = Profile.from_json(json.dumps(OLD))
    assert (profile.source, profile.source_note) == ("measured", "")
    assert (profile.accelerators, profile.kv_cache_tokens) == (1, 0)
    assert profile.kv_budget_tokens == 8 * 512
    assert profile.memory_bytes == 1000 + 8 * 512 * 64
    assert Profile.from_json(profile.to_json()) == profile


def test_new_fields_round_trip():
    profile = Profile.from_json(json.dumps(OLD | {"source": "projected", "source_note": "x2", "accelerators": 2,
                                                  "kv_cache_tokens": 100}))  # fmt: skip
    assert Profile.from_json(profile.to_json()) == profile
    assert profile.kv_budget_tokens == 100 and profile.memory_bytes == 1000 + 100 * 64


@pytest.mark.parametrize("change", [{"source": "guessed"}, {"accelerators": 0}, {"kv_cache_tokens": -1}])
def test_bad_values_are_refused(change):
    with pytest.raises(ValueError):
        Profile.from_json(json.dumps(OLD | change))
