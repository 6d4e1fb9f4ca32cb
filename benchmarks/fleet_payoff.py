"""The seed's payoff on real replicas, measured: a node's budget holds the first model's baseline
replica but not also the second model's, so the second waits pending; `POST /admin/use {"model": ...,
"recipe": "int8"}` shrinks the first model's replica (the rollout starts the int8 replica, then
drains the baseline one) and the second model's pending replica is placed in the room freed, and
serves, while a client loop on the first model counts every failed request.

One gateway in this process (as tests/gateway/test_fleet_payoff.py starts it) in front of real
replica processes: the bundled target (`--kv-cache-tokens 2048`) and the bundled draft (the default
KV budget of 32768 tokens), both needs computed by tandem.deployment.memory_need, nothing given by
hand. The budget is baseline + int8 of the target + 8 MiB, so the rollout fits (old and new side by
side), the draft (computed 502 MiB) does not fit beside the baseline and does beside int8.

Recorded: each replica's computed need (`memory_bytes` in /admin/replicas) and its real resident
memory (VmRSS of its process) before and after, the seconds from the switch to the rollout being
done, to the draft's replica ready, and to its first answer, and the first model's requests (ok,
failed). Nothing here asserts; the failures must be 0 (the test asserts that).

    PYTHONPATH=src .venv/bin/python benchmarks/fleet_payoff.py
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import uvicorn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from host import cpu_model  # noqa: E402
from reliability_attacks import replica_pids  # noqa: E402
from server_process import free_port  # noqa: E402

from tandem.cluster.local import LocalBackend, popen_spawner  # noqa: E402
from tandem.data.bundled import bundled_draft_dir, bundled_model_dir  # noqa: E402
from tandem.deployment.fleet_file import parse_fleet  # noqa: E402
from tandem.deployment.memory_need import replica_bytes_from_args  # noqa: E402
from tandem.gateway.app import create_gateway_app  # noqa: E402
from tandem.gateway.models import build_fleet_gateway  # noqa: E402
from tandem.gateway.wiring import FLEET_SECRET_ENV, new_fleet_secret  # noqa: E402

TARGET, DRAFT = "tandem-code-target", "tandem-code-draft"
NARROW = "int8"
TARGET_ARGS = ["--max-num-seqs", "4", "--kv-cache-tokens", "2048"]
DRAFT_ARGS = ["--max-num-seqs", "4"]  # the default KV budget: its computed need is more than the baseline leaves
MIB = 1 << 20


def needs() -> dict[str, int]:
    return {
        "target_baseline": replica_bytes_from_args(str(bundled_model_dir()), "baseline", TARGET_ARGS),
        "target_int8": replica_bytes_from_args(str(bundled_model_dir()), NARROW, TARGET_ARGS),
        "draft_baseline": replica_bytes_from_args(str(bundled_draft_dir()), "baseline", DRAFT_ARGS),
    }


def fleet_file(budget: int) -> dict:
    return {
        "threads": 1,
        "nodes": {"memory": budget},
        "policy": {"name": "kpa", "interval_s": 0.25},
        "models": [
            {"name": TARGET, "model": f"bundled:{TARGET}",
             "variants": [{"name": "base", "recipe": "baseline", "replicas": {"min": 1, "max": 1},
                           "args": TARGET_ARGS}]},
            {"name": DRAFT, "model": f"bundled:{DRAFT}",
             "variants": [{"name": "base", "recipe": "baseline", "replicas": {"min": 1, "max": 1},
                           "args": DRAFT_ARGS}]},
        ],
    }  # fmt: skip


def wait_until(check, deadline_s: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        if check():
            return time.monotonic() - started
        time.sleep(0.1)
    raise TimeoutError(f"timed out after {deadline_s:.0f} s waiting for {what}")


class Gateway:
    """A many-model gateway in this process on a LocalBackend with a memory budget."""

    def __init__(self, raw: dict, log_dir: Path) -> None:
        secret = new_fleet_secret()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_") or k == "TANDEM_CACHE"}
        env[FLEET_SECRET_ENV] = secret
        plan = parse_fleet(raw)
        self.local = LocalBackend(
            spawn=popen_spawner(log_dir), base_env=env, kill_after_s=20.0, memory_bytes=plan.nodes.memory_bytes
        )
        self.gw = build_fleet_gateway(plan, self.local, buffer_timeout_s=90.0, fleet_secret=secret)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(create_gateway_app(self.gw), host="127.0.0.1", port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None
        self.thread = threading.Thread(target=self.server.run, name="gateway", daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, 30, "the gateway to listen")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        try:
            wait_until(lambda: not self.local.stopping, 30, "replicas to exit")
        except TimeoutError:
            for proc in self.local._stopping.values():  # a straggler: leave no process behind
                try:
                    os.kill(proc.handle.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


class ClientLoop:
    """Requests to one model, one after another, until stopped: every answer counted."""

    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model
        self.ok, self.failures, self.latencies = 0, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        body = {"model": self.model, "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}
        with httpx.Client(base_url=self.url, timeout=120) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    response = client.post("/v1/completions", json=body)
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                    continue
                if response.status_code == 200:
                    self.ok += 1
                    self.latencies.append(time.monotonic() - started)
                else:
                    self.failures.append(f"{response.status_code} {response.text[:200]}")

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(150)


def rss_bytes(pid: int) -> int | None:
    """The process's resident memory (VmRSS in /proc/PID/status), None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def replicas(url: str) -> list[dict]:
    """Every replica in /admin/replicas, with its process's pid and VmRSS where it runs."""
    pids = replica_pids()
    rows = []
    for r in httpx.get(url + "/admin/replicas", timeout=10).json()["replicas"]:
        pid = pids.get(r["id"])
        rss = rss_bytes(pid) if pid is not None else None
        rows.append(
            {
                "model": r["model"], "id": r["id"], "recipe": r["recipe"], "state": r["state"],
                "memory_bytes": r["memory_bytes"], "memory_mib": round(r["memory_bytes"] / MIB, 1),
                "reason": r["reason"], "pid": pid, "rss_bytes": rss,
                "rss_mib": None if rss is None else round(rss / MIB, 1),
            }
        )  # fmt: skip
    return rows


def rollout_phase(url: str) -> str | None:
    rollout = httpx.get(url + f"/admin/rollout?model={TARGET}", timeout=10).json()["rollout"]
    if rollout is not None and rollout["phase"] == "aborted":
        raise RuntimeError(f"the rollout aborted: {rollout}")
    return None if rollout is None else rollout["phase"]


def run(log_dir: Path) -> dict:
    need = needs()
    budget = need["target_baseline"] + need["target_int8"] + 8 * MIB
    gateway = Gateway(fleet_file(budget), log_dir)
    try:
        target, draft = gateway.gw.models[TARGET], gateway.gw.models[DRAFT]
        wait_until(target.fleet.ready, 240, "the first model's baseline replica")
        time.sleep(1.0)  # let the draft's placement be tried (and refused) at least once
        before = replicas(gateway.url)
        loop = ClientLoop(gateway.url, TARGET)
        wait_until(lambda: loop.ok >= 3, 60, "the client's first answers")
        ok_before = loop.ok
        switched_at = time.monotonic()
        used = httpx.post(gateway.url + "/admin/use", json={"model": TARGET, "recipe": NARROW}, timeout=30)
        if used.status_code != 202:
            raise RuntimeError(f"/admin/use answered {used.status_code}: {used.text}")
        rollout_done_s = wait_until(lambda: rollout_phase(gateway.url) == "done", 300, "the rollout to int8")
        draft_ready_s = time.monotonic() - switched_at
        draft_ready_s += wait_until(draft.fleet.ready, 300, "the draft's replica, placed in the room freed")
        served = httpx.post(
            gateway.url + "/v1/completions", json={"model": DRAFT, "prompt": "def f(x):", "max_tokens": 8}, timeout=120
        )
        draft_served_s = time.monotonic() - switched_at
        wait_until(lambda: loop.ok >= ok_before + 3, 60, "the first model still answering")
        loop.finish()
        after = replicas(gateway.url)
    finally:
        gateway.stop()
    latencies = sorted(loop.latencies)
    held = lambda rows: sum(r["memory_bytes"] for r in rows if r["state"] != "starting" or r["reason"] is None)  # noqa: E731
    rss = lambda rows: sum(r["rss_bytes"] or 0 for r in rows)  # noqa: E731
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpu": cpu_model(), "cores": os.cpu_count(), "shared": True},
        "command": "PYTHONPATH=src .venv/bin/python benchmarks/fleet_payoff.py",
        "budget_bytes": budget,
        "budget_mib": round(budget / MIB, 1),
        "computed_needs_mib": {k: round(v / MIB, 1) for k, v in need.items()},
        "before": before,
        "after": after,
        "reserved_mib": {"before": round(held(before) / MIB, 1), "after": round(held(after) / MIB, 1)},
        "rss_mib": {"before": round(rss(before) / MIB, 1), "after": round(rss(after) / MIB, 1)},
        "switch": {
            "recipe": NARROW,
            "rollout_done_s": round(rollout_done_s, 1),
            "draft_ready_s": round(draft_ready_s, 1),
            "draft_served_s": round(draft_served_s, 1),
            "draft_status": served.status_code,
        },
        "first_model_requests": {
            "ok": loop.ok,
            "failed": len(loop.failures),
            "failures": loop.failures[:10],
            "latency_p50_s": round(latencies[len(latencies) // 2], 3) if latencies else None,
            "latency_max_s": round(latencies[-1], 3) if latencies else None,
        },
    }


def markdown(result: dict) -> str:
    def table(rows: list[dict]) -> str:
        lines = ["| model | recipe | state | computed need | RSS | reason |", "|---|---|---|---|---|---|"]
        for r in rows:
            rss = "-" if r["rss_mib"] is None else f"{r['rss_mib']} MiB"
            lines.append(
                f"| {r['model']} | {r['recipe']} | {r['state']} | {r['memory_mib']} MiB | {rss} | {r['reason'] or ''} |"
            )
        return "\n".join(lines)

    s, q = result["switch"], result["first_model_requests"]
    old = next(r for r in result["before"] if r["model"] == TARGET)
    new = next(r for r in result["after"] if r["model"] == TARGET)
    need_saved = round(old["memory_mib"] - new["memory_mib"], 1)
    rss_saved = round((old["rss_mib"] or 0) - (new["rss_mib"] or 0), 1)
    return f"""# The seed's payoff on real replicas: int8 makes room for a second model

Made on {result["date"]} on {result["host"]["cpu"]} ({result["host"]["cores"]} cores, shared with
other agents' work: the seconds are noisy, the memory is not). Results: `fleet_payoff.json`.

```
{result["command"]}
```

One gateway, two models on one node whose budget is {result["budget_mib"]} MiB (the target's
baseline + int8 needs + 8 MiB): the bundled target (`--kv-cache-tokens 2048`) and the bundled draft
(default KV budget), both at one replica. Needs are computed (`memory_bytes`); RSS is the replica
process's VmRSS.

Before `POST /admin/use {{"model": "{TARGET}", "recipe": "{s["recipe"]}"}}`:

{table(result["before"])}

After:

{table(result["after"])}

Reserved on the node: {result["reserved_mib"]["before"]} MiB before, {result["reserved_mib"]["after"]} MiB after
(both models); resident: {result["rss_mib"]["before"]} MiB before (one process), {result["rss_mib"]["after"]} MiB
after (two).
From the switch: the rollout (an int8 replica started beside the baseline, traffic shifted to
it, the baseline drained) done in {s["rollout_done_s"]} s; the draft's replica, placed once the
baseline's process had exited, ready at {s["draft_ready_s"]} s; its first answer
({s["draft_status"]}) at {s["draft_served_s"]} s. The first model during the switch:
{q["ok"]} requests answered, {q["failed"]} failed (latency p50 {q["latency_p50_s"]} s,
max {q["latency_max_s"]} s).

The computed need is what the node's budget is charged; RSS is what the process holds. The
target's int8 need is {need_saved} MiB below its baseline's; its RSS is {rss_saved} MiB below. On the
bundled (tiny) target the runtime (Python, torch, the server: about 448 MiB of each need) dominates
both; why the RSS drop is smaller than the computed one was not measured here. The node's room is
reserved by the computed need, so what was freed for the draft is the computed difference.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fleet_payoff")
    parser.add_argument("--markdown-only", action="store_true", help="rewrite the .md from the .json, no run")
    args = parser.parse_args()
    if args.markdown_only:
        args.out.with_suffix(".md").write_text(markdown(json.loads(args.out.with_suffix(".json").read_text())))
        return
    with tempfile.TemporaryDirectory(prefix="fleet-payoff-") as logs:
        try:
            result = run(Path(logs))
        except Exception:
            for log in Path(logs).glob("*.log"):
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    print(json.dumps({k: result[k] for k in ("reserved_mib", "rss_mib", "switch", "first_model_requests")}, indent=2))


if __name__ == "__main__":
    main()
