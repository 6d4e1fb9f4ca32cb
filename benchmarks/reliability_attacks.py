"""The attacks of issue 22, as scenarios of benchmarks/reliability.py: what each one gets from a real
gateway and its replica (status codes, a neighbour's latency p50/max, metric series, time to fail).

Each scenario is a function of an `AttackFleet` (one gateway process with --api-key in front of one
replica of the bundled model, so an attack and its neighbours share that replica; the operator
errors, which start gateways of their own, are in reliability_operator_errors.py), returns a
JSON-able dict, and is bounded in time:
every request has a client timeout, every wait a deadline. Nothing here asserts: the numbers are
recorded, and the reliability page of the docs says what they should be.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from server_process import ServerProcess  # noqa: E402

MODEL = "tandem-code-target"
KEY = "reliability-user-key"
SMALL = {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}
ATTACK_TIMEOUT_S = 45.0  # one attack request's client timeout (the issue saw >90 s for the worst)


@dataclass
class AttackFleet:
    gateway: ServerProcess
    logs: Path

    @property
    def url(self) -> str:
        return self.gateway.url

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {KEY}"}

    def settle(self, deadline_s: float = 90.0) -> float:
        """Wait until the fleet serves again (a replica ready, its breaker closed, a small request 200),
        so one scenario's damage is not the next one's result. The seconds it took."""
        started = time.monotonic()
        while time.monotonic() - started < deadline_s:
            try:
                metrics = httpx.get(self.url + "/metrics", headers=self.auth, timeout=10).text
                closed = _gateway_series(metrics, "tandem:breaker_state") == 0
                if closed and httpx.post(self.url + "/v1/completions", json=SMALL, headers=self.auth,
                                         timeout=30).status_code == 200:  # fmt: skip
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        return round(time.monotonic() - started, 1)

    def replica(self) -> dict:
        """The one ready replica (/admin/replicas), with its fleet secret read from its environment."""
        view = httpx.get(self.url + "/admin/replicas", headers=self.auth, timeout=30).json()
        replica = next(r for r in view["replicas"] if r["state"] == "ready")
        pid = _replica_pid(replica["id"])
        environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        secret = next(e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"TANDEM_FLEET_SECRET="))
        return {**replica, "pid": pid, "secret": secret}


def start_attack_fleet(logs: Path, first_byte_timeout_s: float) -> AttackFleet:
    logs.mkdir(parents=True, exist_ok=True)
    gateway = ServerProcess(
        [
            "--recipe", "baseline", "--threads", "1", "--replicas-min", "1", "--replicas-max", "1", "--policy", "hpa",
            "--api-key", KEY, "--first-byte-timeout", str(first_byte_timeout_s),
            "--log-dir", str(logs / "attack-replicas"),
        ],
        logs / "attack-gateway.log",
    )  # fmt: skip
    gateway.wait_ready(timeout=300)
    return AttackFleet(gateway, logs)


def replica_pids() -> dict[str, int]:
    """Every running replica's pid by its --replica-id (read from /proc)."""
    pids = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "--replica-id" in argv:
            pids[argv[argv.index("--replica-id") + 1]] = int(entry.name)
    return pids


def _replica_pid(replica_id: str) -> int:
    pid = replica_pids().get(replica_id)
    if pid is None:
        raise LookupError(f"no process for replica {replica_id}")
    return pid


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


class Neighbours:
    """`count` threads sending small completions through the gateway until stopped: what an attack
    does to everyone else on the replica."""

    def __init__(self, fleet: AttackFleet, count: int = 2) -> None:
        self.fleet, self.lock, self.stopped = fleet, threading.Lock(), threading.Event()
        self.latencies: list[float] = []
        self.statuses: Counter = Counter()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]
        for thread in self.threads:
            thread.start()

    def _run(self) -> None:
        with httpx.Client(base_url=self.fleet.url, headers=self.fleet.auth, timeout=150) as client:
            while not self.stopped.is_set():
                started = time.monotonic()
                try:
                    status = client.post("/v1/completions", json=SMALL).status_code
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                with self.lock:
                    self.latencies.append(time.monotonic() - started)
                    self.statuses[str(status)] += 1
                if status != 200:
                    time.sleep(0.2)  # a 429 answers at once: do not spin

    def stop(self) -> dict:
        self.stopped.set()
        for thread in self.threads:
            thread.join(160)
        return {
            "requests": len(self.latencies),
            "statuses": dict(self.statuses),
            "latency_p50_s": _percentile(self.latencies, 0.5),
            "latency_max_s": round(max(self.latencies), 3) if self.latencies else None,
        }


def _attack(fleet: AttackFleet, bodies: list[dict], path: str = "/v1/completions") -> dict:
    """Send `bodies` at once through the gateway, 2 neighbours beside them; what each got."""

    def send(body: dict) -> dict:
        started = time.monotonic()
        data = json.dumps(body, separators=(",", ":")).encode()
        try:
            r = httpx.post(
                fleet.url + path, content=data, timeout=ATTACK_TIMEOUT_S,
                headers={**fleet.auth, "Content-Type": "application/json"},
            )  # fmt: skip
            status, detail = r.status_code, r.text[:200] if r.status_code != 200 else ""
        except httpx.HTTPError as exc:
            status, detail = type(exc).__name__, str(exc)[:200]
        return {"status": status, "seconds": round(time.monotonic() - started, 2), "body_bytes": len(data),
                "detail": detail}  # fmt: skip

    time.sleep(1.0)  # let the previous scenario's work drain
    neighbours = Neighbours(fleet)
    time.sleep(1.0)  # neighbours alone first: their latency without the attack is part of the sample
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(send, bodies))
    time.sleep(1.0)
    return {"attack": answers, "neighbours": neighbours.stop()}


# --- 1. traversal to the replica door --------------------------------------------------------------
TRAVERSAL_FORMS = {
    "../": "/v1/models/../../{target}",
    "%2e%2e/": "/v1/models/%2e%2e/%2e%2e/{target}",
    "..%2f": "/v1/models/..%2f..%2f{target}",
    "//": "//{target}",
    "absolute-form": "http://127.0.0.1:{port}/{target}",
}
TRAVERSAL_TARGETS = ("metrics", "load", "openapi.json", "gate/tracks/0123456789abcdef")


def _raw_get(port: int, target: str, headers: dict[str, str]) -> tuple[int | None, str]:
    """GET exactly `target` (no client normalizes it): the status and the start of the body."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{head}Connection: close\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while len(data) < 1 << 20:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    parts = status_line.split()
    body = rest.partition(b"\r\n\r\n")[2].decode(errors="replace")
    return (int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None), body


def _replica_body(target: str, status: int | None, body: str) -> bool:
    """Whether the answer is the replica's own (what the gateway must never hand out)."""
    if status != 200:
        return False
    if target == "metrics":
        return "tandem:request_success" in body  # a replica's family; the gateway's are tandem:gateway_*
    if target == "load":
        return '"kv_used"' in body
    if target == "openapi.json":
        return '"title":"tandem"' in body.replace(" ", "")
    return True  # the kept-track route exists on replicas only


def traversal(fleet: AttackFleet) -> dict:
    port = fleet.gateway.port
    answers = {}
    for form, template in TRAVERSAL_FORMS.items():
        for target in TRAVERSAL_TARGETS:
            path = template.format(target=target, port=port)
            try:
                status, body = _raw_get(port, path, fleet.auth)
            except OSError as exc:
                status, body = None, repr(exc)
            answers[f"{form} {target}"] = {"status": status, "replica_body": _replica_body(target, status, body)}
    return {
        "with_a_user_key": True,
        "answers": answers,
        "replica_bodies_handed_out": sum(a["replica_body"] for a in answers.values()),
    }


# --- 2. fields with no bound ---------------------------------------------------------------------
def unbounded_fields(fleet: AttackFleet) -> dict:
    prompt = "def fibonacci(n):"
    return {
        "stop_token_ids_400k_n16_min_tokens_200": _attack(
            fleet,
            [
                {
                    "model": MODEL,
                    "prompt": prompt,
                    "n": 16,
                    "min_tokens": 200,
                    "max_tokens": 256,
                    "stop_token_ids": [1] * 400_000,
                }
            ],  # fmt: skip
        ),
        "bad_words_256x3900_n16": _attack(
            fleet, [{"model": MODEL, "prompt": prompt, "n": 16, "max_tokens": 32, "bad_words": ["ab" * 1950] * 256}]
        ),
        "logit_bias_1024_n16_x4": _attack(
            fleet,
            [
                {
                    "model": MODEL,
                    "prompt": prompt,
                    "n": 16,
                    "max_tokens": 64,
                    "logit_bias": {str(i): 1.0 for i in range(1024)},
                }
            ]
            * 4,  # fmt: skip
        ),
        "logprobs_20_n16_x4": _attack(
            fleet, [{"model": MODEL, "prompt": prompt, "n": 16, "max_tokens": 64, "logprobs": 20}] * 4
        ),
    }


# --- 3. one request that fills a replica ---------------------------------------------------------
def prompt_list(fleet: AttackFleet) -> dict:
    body = {"model": MODEL, "prompt": [f"def f{i}(x):" for i in range(20)], "n": 16, "max_tokens": 128}
    result = _attack(fleet, [body])
    result["sequences"] = 20 * 16
    return result


# --- 4. a slow first byte beside 4 neighbours ------------------------------------------------------
def _stream(fleet: AttackFleet, body: dict) -> dict:
    started, first = time.monotonic(), None
    text = ""
    try:
        with httpx.stream(
            "POST", fleet.url + "/v1/completions", json={**body, "stream": True}, headers=fleet.auth, timeout=120
        ) as r:
            status = r.status_code
            for chunk in r.iter_text():
                first = first if first is not None else time.monotonic() - started
                text += chunk
    except httpx.HTTPError as exc:
        status, text = type(exc).__name__, text + repr(exc)
    errors = re.findall(r'"code":\s*"([a-z_]+)"', text)
    return {
        "status": status,
        "first_byte_s": round(first, 2) if first is not None else None,
        "seconds": round(time.monotonic() - started, 2),
        "finished": text.rstrip().endswith("data: [DONE]") and '"error"' not in text,
        "error_codes": errors,
    }


def _gateway_series(text: str, family: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(family))


def slow_first_byte(fleet: AttackFleet) -> dict:
    neighbour = {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 300, "ignore_eos": True}
    # A stop string of 5,000 characters that never comes holds the text back to the end: the first
    # chunk is legitimately late (the context is 512 tokens, so the end comes in seconds, not minutes).
    slow = {"model": MODEL, "prompt": "def fibonacci(n):", "max_tokens": 480, "ignore_eos": True,
            "stop": ["\u00a7" * 5000]}  # fmt: skip
    before = httpx.get(fleet.url + "/metrics", headers=fleet.auth, timeout=30).text
    time.sleep(1.0)
    with ThreadPoolExecutor(5) as pool:
        neighbours = [pool.submit(_stream, fleet, neighbour) for _ in range(4)]
        time.sleep(0.5)  # the neighbours are streaming when the slow one comes
        slow_answer = pool.submit(_stream, fleet, slow)
        answers = [f.result() for f in neighbours]
        slow_result = slow_answer.result()
    after = httpx.get(fleet.url + "/metrics", headers=fleet.auth, timeout=30).text
    return {
        "slow_stream": slow_result,
        "neighbour_streams": answers,
        "neighbours_finished": sum(a["finished"] for a in answers),
        "gateway_retries": _gateway_series(after, "tandem:gateway_retries_total")
        - _gateway_series(before, "tandem:gateway_retries_total"),
        "gateway_stream_errors": _gateway_series(after, "tandem:gateway_stream_errors_total")
        - _gateway_series(before, "tandem:gateway_stream_errors_total"),
        "breaker_state_after": _gateway_series(after, "tandem:breaker_state"),  # 0 closed, 1 half-open, 2 open
    }


# --- 5. metric labels from closed sets only -------------------------------------------------------
def _series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def _label_flood(url: str, count: int, headers: dict[str, str] | None = None) -> Counter:
    """`count` requests, each with a path or a method never sent before (half each)."""
    statuses: Counter = Counter()
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        for i in range(count):
            try:
                if i % 2:
                    r = client.request(f"M{i}", "/v1/models")
                else:
                    r = client.get(f"/no/such/path/{i}")
                statuses[str(r.status_code)] += 1
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1
    return statuses


def metric_labels(fleet: AttackFleet, count: int) -> dict:
    replica = fleet.replica()
    secret = {"Authorization": f"Bearer {replica['secret']}"}

    def scrape(url: str, headers: dict[str, str]) -> tuple[int, int, float]:
        started = time.monotonic()
        text = httpx.get(url + "/metrics", headers=headers, timeout=60).text
        return _series(text), len(text.encode()), round(time.monotonic() - started, 3)

    result = {}
    for name, url, headers, scrape_headers in (
        ("replica_without_a_key", replica["address"], None, secret),
        ("gateway_with_the_user_key", fleet.url, fleet.auth, fleet.auth),
    ):
        series_before, bytes_before, _ = scrape(url, scrape_headers)
        started = time.monotonic()
        statuses = _label_flood(url, count, headers)
        seconds = round(time.monotonic() - started, 1)
        series_after, bytes_after, scrape_s = scrape(url, scrape_headers)
        result[name] = {
            "requests": count, "seconds": seconds, "statuses": dict(statuses),
            "series_before": series_before, "series_after": series_after,
            "metrics_bytes_before": bytes_before, "metrics_bytes_after": bytes_after, "scrape_s_after": scrape_s,
        }  # fmt: skip
    return result


FLEET_SCENARIOS: dict[str, Callable[..., dict]] = {
    "traversal": traversal,
    "unbounded_fields": unbounded_fields,
    "prompt_list": prompt_list,
    "slow_first_byte": slow_first_byte,
    "metric_labels": metric_labels,
}
