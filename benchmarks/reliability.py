"""Reliability probe: a real gateway and its replicas under load, bad inputs, floods, faults and attacks.

Scenarios (all by default; `--scenarios a,b` runs some):
- load_and_faults: `tandem serve` as a gateway (two replicas of the bundled model, 1 thread each)
  and, while --clients clients keep sending good requests (half of them streams), in turn:
  bad inputs, each sent --bad-rounds times (lone surrogates, deep and broken JSON, wrong types, an
  unknown model, a 2 MB body, an empty body): every answer must be a 4xx with an OpenAI error body;
  a 1 GB chunked body: how much the gateway read, its peak memory before and after; a connection
  flood (3,000 half-sent connections, then 500 more per second): a new client's time; a frozen
  replica (SIGSTOP) and, once replaced, a killed one (SIGKILL): what clients saw. Good requests must
  all succeed; streams (greedy) under way on the failed replica are resumed elsewhere (counted:
  resumed, identical to an uninterrupted answer, lost to an error event).
- The attacks of issue 22 (benchmarks/reliability_attacks.py), on a second gateway (--api-key, one
  replica, so an attack and its neighbours share it): traversal (`../`, `%2e%2e/`, `..%2f`, `//`,
  absolute-form) to the replica-only routes; unbounded_fields (stop_token_ids 400k x n=16 x
  min_tokens 200, bad_words 256 x 3,900 chars x n=16, logit_bias 1024 and logprobs 20 with n=16,
  four at once); prompt_list (20 prompts x n=16 = 320 sequences); slow_first_byte (a stream whose
  first chunk is held back by a 5,000-character stop string, beside 4 streaming neighbours);
  metric_labels (--label-requests distinct methods and paths against /metrics series counts);
  and two operator errors, each on gateways of its own (benchmarks/reliability_operator_errors.py):
  long_recipe (a 287-character recipe, valid and with a typo) and overlapping_ports
  (--replica-ports holding the gateway's own port).
Each reports what the attack got: status codes, neighbour latency p50/max, series counts, time to
fail. Bounded in time (every request has a timeout, every wait a deadline; all of it a few minutes
plus the replicas' start-ups); writes --out (default benchmarks/results/reliability.json) with the
command, the machine's load and every count.

    .venv/bin/python benchmarks/reliability.py
    .venv/bin/python benchmarks/reliability.py --scenarios traversal,overlapping_ports --out /tmp/r.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the same flood and process helpers the tests use
sys.path.insert(0, str(ROOT / "benchmarks"))

from host import cpu_model  # noqa: E402
from reliability_attacks import FLEET_SCENARIOS, replica_pids, start_attack_fleet  # noqa: E402
from reliability_operator_errors import OPERATOR_SCENARIOS  # noqa: E402
from server_process import ServerProcess  # noqa: E402

SCENARIOS = ("load_and_faults", *FLEET_SCENARIOS, *OPERATOR_SCENARIOS)

MODEL = "tandem-code-target"
GOOD = {"model": MODEL, "prompt": "def fibonacci(n):", "max_tokens": 32, "temperature": 0.7}
# Streams are greedy, so a stream resumed after a fault can be checked against an uninterrupted answer.
GREEDY_STREAM = {"model": MODEL, "prompt": "def quicksort(items):", "max_tokens": 48, "temperature": 0, "stream": True,
                 "ignore_eos": True}  # fmt: skip


def stream_text(raw: str) -> str:
    """The completion text of a server-sent event stream."""
    text = ""
    for line in raw.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices") or ():
                text += choice.get("text") or ""
    return text


BAD = {
    "lone surrogate in the prompt": b'{"model": "%s", "prompt": "\\ud800"}' % MODEL.encode(),
    "lone surrogate in chat content": b'{"model": "%s", "messages": [{"role": "user", "content": "\\udfff"}]}'
    % MODEL.encode(),
    "100,000-deep JSON": b"[" * 100_000 + b"]" * 100_000,
    "broken JSON": b'{"model": "x", "prompt": ',
    "wrong types": b'{"model": 5, "prompt": {"a": 1}, "max_tokens": "many"}',
    "an unknown model": b'{"model": "gpt-9", "prompt": "hi"}',
    "a 2 MB body": b'{"prompt": "' + b"x" * (2 << 20) + b'"}',
    "an empty body": b"",
    "invalid UTF-8": b'{"prompt": "\xff\xfe"}',
}


class Clients:
    """Good requests in a loop from `count` threads; every outcome recorded."""

    def __init__(self, url: str, count: int) -> None:
        self.url, self.lock, self.stopped = url, threading.Lock(), threading.Event()
        self.ok = 0
        self.failed: list[str] = []  # failed before any byte: must stay empty
        self.broken_streams: list[str] = []  # ended by an error event after data: allowed only at a replica failure
        self.unfinished_streams = 0  # streams without data: [DONE]: must stay 0
        self.slowest = 0.0
        self.reference: str | None = None  # the greedy stream's text, uninterrupted (set before any fault)
        self.identical = 0  # streams whose text is the reference's
        self.different: list[str] = []  # streams that ended well with another text: must stay empty
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(count)]
        for thread in self.threads:
            thread.start()

    def run(self, worker: int) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as client:
            n = 0
            while not self.stopped.is_set():
                stream, n = (worker + n) % 2 == 0, n + 1
                started = time.monotonic()
                try:
                    if stream:
                        with client.stream("POST", "/v1/completions", json=GREEDY_STREAM) as r:
                            text = "".join(r.iter_text()) if r.status_code == 200 else r.read().decode()
                        ok = r.status_code == 200 and '"error"' not in text
                        mid = r.status_code == 200 and text.startswith("data: {") and not ok
                        done = text.endswith("data: [DONE]\n\n")
                    else:
                        r = client.post("/v1/completions", json=GOOD)
                        ok, mid, done, text = r.status_code == 200, False, True, r.text
                except httpx.HTTPError as exc:
                    ok, mid, done, text = False, False, True, repr(exc)
                with self.lock:
                    self.slowest = max(self.slowest, time.monotonic() - started)
                    if ok:
                        self.ok += 1
                        if stream and self.reference is not None:
                            got = stream_text(text)
                            if got == self.reference:
                                self.identical += 1
                            else:
                                self.different.append(got[-100:])
                    elif mid:
                        self.broken_streams.append(text[-200:])
                    else:
                        self.failed.append(text[-300:])
                    self.unfinished_streams += 0 if done else 1

    def stop(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(180)


def peak_memory(pid: int) -> int:
    for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def ready_replicas(url: str) -> list[dict]:
    replicas = httpx.get(url + "/admin/replicas", timeout=10).json()["replicas"]
    return [r for r in replicas if r["state"] == "ready"]


def bad_inputs(url: str, rounds: int) -> dict:
    statuses: dict[str, Counter] = {name: Counter() for name in BAD}
    shapes_ok = True
    with httpx.Client(base_url=url, timeout=60, headers={"Content-Type": "application/json"}) as client:
        for _ in range(rounds):
            for name, body in BAD.items():
                r = client.post("/v1/completions", content=body)
                statuses[name][r.status_code] += 1
                shapes_ok = shapes_ok and set(r.json().get("error", {})) == {"message", "type", "param", "code"}
    return {"rounds": rounds, "statuses": {k: dict(v) for k, v in statuses.items()}, "all_openai_bodies": shapes_ok}


def huge_body(url: str, port: int, pid: int) -> dict:
    before = peak_memory(pid)
    sent, started = 0, time.monotonic()
    chunk = b"%x\r\n%s\r\n" % (1 << 16, b"x" * (1 << 16))
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        sock.settimeout(3)
        try:
            while sent < 1 << 30:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        sock.settimeout(10)
        answer = sock.recv(4096)
    return {
        "status_line": answer.split(b"\r\n", 1)[0].decode(errors="replace"),
        "bytes_sent_before_the_gateway_stopped_reading": sent,
        "seconds": round(time.monotonic() - started, 2),
        "gateway_peak_memory_growth_bytes": peak_memory(pid) - before,
    }


def flood(url: str, port: int) -> dict:
    """In a child process, so the flood's and the new clients' times are the gateway's, not this process's
    (whose client threads hold the GIL)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[3]); from flood import flood_and_measure; "
        "print(json.dumps(flood_and_measure(sys.argv[1], int(sys.argv[2]), samples=10)))"
    )
    child = subprocess.run(
        [sys.executable, "-c", code, url, str(port), str(ROOT / "tests")], capture_output=True, text=True, timeout=300
    )
    seen = json.loads(child.stdout.strip().splitlines()[-1])
    return {
        "half_sent_connections": seen["connections"],
        "burst_absorbed_s": round(seen["burst_absorbed_s"], 2),
        "new_client_seconds_max": round(max(seen["new_client_s"]), 3),
        "new_client_seconds_median": round(sorted(seen["new_client_s"])[len(seen["new_client_s"]) // 2], 3),
        "burst_connections_left_open_past_the_header_deadline": seen["left_open"],
    }


def resumed_streams(url: str) -> float:
    """Streams the gateway resumed after a break (tandem:gateway_resumes_total, all variants and reasons)."""
    metrics = httpx.get(url + "/metrics", timeout=10).text
    name = "tandem:gateway_resumes_total"
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(name))


def fault(url: str, clients: Clients, sig: signal.Signals, wait_s: float) -> dict:
    replicas = ready_replicas(url)
    victim = replicas[0]["id"]
    pid = replica_pids()[victim]
    before_ok, before_broken = clients.ok, len(clients.broken_streams)
    before_resumed, before_same, before_different = resumed_streams(url), clients.identical, len(clients.different)
    os.kill(pid, sig)
    at = time.monotonic()
    time.sleep(wait_s)
    served = clients.ok - before_ok
    if sig == signal.SIGSTOP:
        os.kill(pid, signal.SIGKILL)  # the gateway's controller replaces it either way

    def replaced_by_another() -> bool:
        ready = ready_replicas(url)
        return len(ready) >= 2 and victim not in {r["id"] for r in ready}

    replaced = wait_until(replaced_by_another, 120)
    return {
        "signal": sig.name,
        "requests_served_in_the_next_s": {"seconds": wait_s, "count": served},
        "streams_ended_by_an_error_event": len(clients.broken_streams) - before_broken,  # lost
        "streams_resumed": resumed_streams(url) - before_resumed,
        "greedy_streams_identical_to_an_uninterrupted_run": clients.identical - before_same,
        "greedy_streams_different": len(clients.different) - before_different,
        "back_to_two_ready_replicas_s": round(time.monotonic() - at, 1) if replaced else None,
    }


def load_and_faults(args: argparse.Namespace, logs: Path) -> dict:
    gateway = ServerProcess(
        [
            "--recipe", "baseline", "--threads", "1", "--replicas-min", "2", "--replicas-max", "2", "--policy", "hpa",
            "--first-byte-timeout", str(args.deadline_s), "--stream-idle-timeout", str(args.deadline_s),
            "--max-connections", "1000", "--header-timeout", "5", "--log-dir", str(logs / "replicas"),
        ],
        logs / "gateway.log",
    )  # fmt: skip
    result: dict = {}
    try:
        gateway.wait_ready(timeout=300)
        wait_until(lambda: len(ready_replicas(gateway.url)) == 2, 300)
        memory_at_start = peak_memory(gateway.proc.pid)
        uninterrupted = httpx.post(gateway.url + "/v1/completions", json=GREEDY_STREAM, timeout=120).text
        clients = Clients(gateway.url, args.clients)
        clients.reference = stream_text(uninterrupted)
        started = time.monotonic()
        wait_until(lambda: clients.ok >= args.clients, 120)
        result["bad_inputs"] = bad_inputs(gateway.url, args.bad_rounds)
        result["one_gigabyte_body"] = huge_body(gateway.url, gateway.port, gateway.proc.pid)
        lines_before = len(gateway.log().splitlines())
        result["connection_flood"] = flood(gateway.url, gateway.port)
        result["connection_flood"]["gateway_log_lines"] = len(gateway.log().splitlines()) - lines_before
        result["frozen_replica"] = fault(gateway.url, clients, signal.SIGSTOP, 4 * args.deadline_s)
        result["killed_replica"] = fault(gateway.url, clients, signal.SIGKILL, 4 * args.deadline_s)
        clients.stop()
        result["good_requests"] = {
            "clients": args.clients,
            "seconds": round(time.monotonic() - started, 1),
            "succeeded": clients.ok,
            "failed_before_a_byte": len(clients.failed),
            "failures": clients.failed[:5],
            "streams_ended_by_an_error_event": len(clients.broken_streams),
            "streams_without_done": clients.unfinished_streams,
            "greedy_streams_identical_to_an_uninterrupted_run": clients.identical,
            "greedy_streams_different": clients.different[:5],
            "slowest_s": round(clients.slowest, 2),
        }
        metrics = httpx.get(gateway.url + "/metrics", timeout=10).text
        result["gateway_5xx_answers"] = sum(
            float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
            if line.startswith("tandem:gateway_requests_total") and 'code="5' in line
        )  # fmt: skip
        result["gateway_peak_memory_growth_bytes"] = peak_memory(gateway.proc.pid) - memory_at_start
    finally:
        result["gateway_exit_code"] = gateway.stop()
    return result


def attacks(args: argparse.Namespace, logs: Path, chosen: list[str]) -> dict:
    """The attack scenarios on one gateway of their own, then the operator errors (gateways of theirs)."""
    result: dict = {}
    on_fleet = [name for name in chosen if name in FLEET_SCENARIOS]
    if on_fleet:
        fleet = start_attack_fleet(logs, args.attack_first_byte_timeout_s)
        try:
            for name in on_fleet:
                settled_s = fleet.settle()  # the previous scenario's damage (an open breaker) healed first
                started = time.monotonic()
                extra = {"count": args.label_requests} if name == "metric_labels" else {}
                result[name] = FLEET_SCENARIOS[name](fleet, **extra)
                result[name]["scenario_s"] = round(time.monotonic() - started, 1)
                result[name]["waited_for_the_fleet_to_settle_s"] = settled_s
                print(f"{name}: {round(time.monotonic() - started, 1)} s", file=sys.stderr)
        finally:
            result["attack_gateway_exit_code"] = fleet.gateway.stop()
    for name in chosen:
        if name in OPERATOR_SCENARIOS:
            started = time.monotonic()
            result[name] = OPERATOR_SCENARIOS[name](logs)
            result[name]["scenario_s"] = round(time.monotonic() - started, 1)
            print(f"{name}: {round(time.monotonic() - started, 1)} s", file=sys.stderr)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="scenarios: " + ", ".join(SCENARIOS),
    )  # fmt: skip
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated (default: all)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--bad-rounds", type=int, default=20)
    parser.add_argument("--deadline-s", type=float, default=3.0, help="--first-byte-timeout and --stream-idle-timeout")
    parser.add_argument(
        "--attack-first-byte-timeout-s", type=float, default=5.0,
        help="the attack gateway's --first-byte-timeout (slow_first_byte's stream is later than this)",
    )  # fmt: skip
    parser.add_argument("--label-requests", type=int, default=5000, help="metric_labels: distinct methods/paths")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "reliability.json")
    args = parser.parse_args()
    chosen = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r} (known: {', '.join(SCENARIOS)})")
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"tandem-reliability-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "host_cpu": cpu_model(),
        "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip() or None,
        "scenarios": chosen,
        "load_average_before": os.getloadavg(),
    }  # fmt: skip
    started = time.monotonic()
    try:
        if "load_and_faults" in chosen:
            result.update(load_and_faults(args, logs))
        result.update(attacks(args, logs, chosen))
    finally:
        every_log = [*logs.glob("*.log"), *logs.glob("*/*.log")]
        result["tracebacks_in_logs"] = sum(p.read_text(errors="replace").count("Traceback") for p in every_log)
        result["logs"] = str(logs)
        result["seconds"] = round(time.monotonic() - started, 1)
        result["load_average_after"] = os.getloadavg()
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
