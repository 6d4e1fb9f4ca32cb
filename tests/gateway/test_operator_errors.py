"""Operator errors with real replica processes: a recipe longer than a file name may be serves (its
variant and log files are named from a short hash of it), and one that cannot serve fails its
rollout within a minute with the replica's own error, counted and backed off, not retried every
tick until the rollout's 600 s timeout."""

from __future__ import annotations

import time

import httpx
import pytest

from tandem.cluster.names import short_hash
from tandem.deployment import variant_name

from .harness import MODEL_NAME, RunningGateway, variant, wait_for

pytestmark = pytest.mark.slow

# A valid recipe of 287 characters: its variant's name made a log file name past 255 bytes.
LONG_VALID = "+".join(["baseline"] * 32)
# As long, and it cannot serve: a typo in an optimizer's name (the replica says so, and exits 1).
LONG_BAD = "int8+speculatve(k=2,draft=/srv/models/" + "a-draft-model-directory/" * 10 + "draft)"
WHY = "unknown optimizer 'speculatve'"


def rollout(gw: RunningGateway) -> dict:
    return httpx.get(gw.url + "/admin/rollout", timeout=30).json()["rollout"]


def test_a_long_recipe_serves_and_a_long_bad_one_fails_within_a_minute_with_its_own_error(serve_model_dir, tmp_path):
    assert len(LONG_VALID) > 255 and len(LONG_BAD) > 255
    raw = {"model": str(serve_model_dir), "threads": 1, "variants": [variant("baseline")],
           "policy": {"name": "hpa", "interval_s": 0.5}}  # fmt: skip
    gw = RunningGateway(raw, tmp_path / "logs")
    try:
        gw.wait_ready("baseline")
        answer = httpx.post(gw.url + "/admin/use", json={"recipe": LONG_VALID}, timeout=30)
        assert answer.status_code == 202, answer.text
        name = answer.json()["rollout"]["new"]
        assert name == variant_name(LONG_VALID) and len(name) <= 64 and name.endswith(short_hash(LONG_VALID))
        started = time.monotonic()
        wait_for(lambda: rollout(gw)["phase"] in ("done", "aborted"), 120, "the long recipe's rollout")
        one_start = time.monotonic() - started  # what starting one replica takes on this machine now
        assert rollout(gw)["phase"] == "done", (rollout(gw), gw.logs())
        body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 4}
        assert httpx.post(gw.url + "/v1/completions", json=body, timeout=60).status_code == 200
        logs = sorted(p.name for p in gw.log_dir.glob("*.log"))
        assert f"{name}-2.log" in logs and all(len(log) <= 104 for log in logs), logs

        started = time.monotonic()
        answer = httpx.post(gw.url + "/admin/use", json={"recipe": LONG_BAD, "timeout_s": 600}, timeout=30)
        assert answer.status_code == 202, answer.text
        bad = answer.json()["rollout"]["new"]
        wait_for(lambda: rollout(gw)["phase"] != "starting", 180, "the bad recipe's rollout to end")
        took = time.monotonic() - started
        reason = rollout(gw)["reason"]
        # Three tries, 1 s then 2 s apart (under a minute on an idle machine), not the 600 s timeout;
        # each try is a process that exits at once, so a loaded machine's replica start bounds them.
        assert rollout(gw)["phase"] == "aborted" and took < max(60.0, 3 * one_start + 10), (took, one_start, reason)
        assert WHY in reason and "File name too long" not in reason, reason
        view = httpx.get(gw.url + "/admin/replicas", timeout=30).json()
        exits = [e for e in view["recent_exits"] if e["variant"] == bad]
        assert len(exits) == 3 and all(WHY in (e["error"] or "") for e in exits), exits
        assert view["primary"] == name  # the long valid recipe keeps serving
        assert httpx.post(gw.url + "/v1/completions", json=body, timeout=60).status_code == 200
    finally:
        gw.stop()
