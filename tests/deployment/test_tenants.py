"""The tenants file: keys as hashes or env:VAR, priorities, limits; every mistake named."""

import pytest

from tandem.deployment.tenants import TenantsError, anonymous_tenants, hash_key, load_tenants, new_key, parse_tenants


def file(*tenants, **extra):
    return {"tenants": list(tenants), **extra}


def test_keys_map_to_their_tenant_by_hash_or_environment_variable():
    key, digest = new_key()
    assert digest == hash_key(key) and digest.startswith("sha256:") and len(digest) == 7 + 64
    tenants = parse_tenants(
        file(
            {"name": "search", "keys": [digest], "priority": "interactive", "limits": {"rpm": 60}},
            {"name": "batch-jobs", "keys": ["env:JOBS_KEY"], "priority": "batch", "models": ["tiny"]},
            {"name": "vip", "keys": [hash_key("v")], "priority": 5, "weight": 2},
        ),
        env={"JOBS_KEY": "jobs-secret"},
    )
    assert tenants.by_key(key).name == "search" and tenants.by_key(key).limits.rpm == 60
    assert tenants.by_key("jobs-secret").name == "batch-jobs"
    assert tenants.by_key("jobs-secret").models == ("tiny",)
    assert [t.priority for t in tenants.tenants] == [1, 0, 5]
    assert tenants.by_key("nobody") is None
    assert "jobs-secret" not in repr(tenants) and key not in repr(tenants)  # keys are never kept


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        (file({"name": "a", "keys": ["plaintext-key"]}), "sha256:"),
        (file({"name": "a", "keys": ["env:MISSING"]}), "MISSING is not set"),
        (file({"name": "a", "keys": [hash_key("k")]}, {"name": "b", "keys": [hash_key("k")]}), "a key maps to one"),
        (file({"name": "a", "keys": [hash_key("k")]}, {"name": "a", "keys": [hash_key("j")]}), "listed twice"),
        (file({"name": "a", "keys": [hash_key("k")], "limits": {"rpm": 0}}), "tenants.0.limits.rpm"),
        (file({"name": "a", "keys": [hash_key("k")], "limts": {}}), "limts"),
        (file({"name": "a", "keys": [hash_key("k")], "priority": "urgent"}), "priority"),
        ({"tenants": []}, "tenants"),
    ],
)
def test_a_bad_file_is_refused_naming_the_problem(raw, named):
    with pytest.raises(TenantsError, match=named):
        parse_tenants(raw, env={})


def test_load_names_the_file_when_it_is_not_yaml_or_missing(tmp_path):
    bad = tmp_path / "t.yaml"
    bad.write_text("tenants: [unclosed")
    with pytest.raises(TenantsError, match="not valid YAML"):
        load_tenants(bad)
    with pytest.raises(TenantsError, match="cannot read"):
        load_tenants(tmp_path / "none.yaml")


def test_api_key_alone_is_one_anonymous_admin_tenant():
    tenants = anonymous_tenants("k1")
    assert tenants.by_key("k1").name == "anonymous" and tenants.by_key("k1").admin
    assert tenants.by_key("k2") is None
