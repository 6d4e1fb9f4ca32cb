"""Is the simulator to be trusted? A slice of the trace against real replicas and against `tandem.sim`.

1. Measure the recipe's Profile on this machine (`tandem profile`, the replicas' thread count).
2. Real run: start the gateway with the `tandem serve` CLI (a deployment file: the bundled model, the
   local backend, the capacity policy with that Profile) as a subprocess, and replay the slice of
   the Azure conversation trace against it: each request at its arrival time, streaming, with its
   trace lengths scaled to the model's context (as `tandem bench` does) and its output length
   forced (ignore_eos). The gateway's /metrics is polled for its replicas (starting, ready,
   draining) to integrate replica-seconds.
3. Simulated run: the same slice, Profile, policy, limits and controller interval in `tandem.sim`.
4. Replica-seconds, TTFT p50 and SLO attainment must agree within 20%.

The machine is shared: other jobs on its 2 cores change the CPU a replica gets by several times
within minutes (the kernel shares the CPU between sessions, not processes: each replica and the
profiler run in their own session). The simulator needs the replicas' speed during the run, so
the Profile is rescaled by the CPU share a busy single-threaded process (a probe in its own
session, running throughout) got during the run against what it got while the Profile was
measured. The Profile is measured again after the run; a run counts only if the two rescaled
Profiles agree within --max-drift; otherwise it is recorded and tried again. The
slice's rate is sized from the Profile (--load: replicas of work), so the fleet has to scale.

    .venv/bin/python benchmarks/sim_validate.py                     # -> results/sim_validation.json

Data: Azure LLM inference trace (conversation, 2023), CC-BY 4.0; Patel et al., "Splitwise", ISCA 2024.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from load_test import one_request, start_server
from prometheus_client.parser import text_string_to_metric_families

from tandem.contracts import Profile
from tandem.data import ATTRIBUTION, CONVERSATION_TRACE
from tandem.schedule.policies import CapacityParams, ScaleLimits, make_policy
from tandem.schedule.variant import Variant
from tandem.sim import SimConfig, compress, fit_context, load_trace, simulate
from tandem.sim.sizing import demand_series

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MODEL = ROOT / "models" / "tandem-code-target"
NAME = "v"


PROBE = """
import time
while True:
    wall, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < 0.5:
        sum(range(20000))
    print(time.perf_counter(), time.process_time() - cpu, time.perf_counter() - wall, flush=True)
"""


class CpuShare:
    """A busy single-threaded process in its own session: the share of a CPU such a process gets now.

    The kernel divides the CPU between sessions, so a replica (its own session, one torch thread)
    gets what the probe gets; `share(start, end)` is the probe's CPU seconds over wall seconds.
    """

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", PROBE], stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)  # fmt: skip
        self.samples: list[tuple[float, float, float]] = []  # (time, cpu seconds, wall seconds)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            at, cpu, wall = (float(x) for x in line.split())
            self.samples.append((at, cpu, wall))

    def share(self, start: float, end: float) -> float:
        inside = [(cpu, wall) for at, cpu, wall in self.samples if start <= at <= end]
        return sum(c for c, _ in inside) / sum(w for _, w in inside) if inside else float("nan")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def rescaled(profile: Profile, factor: float) -> Profile:
    """The Profile at `factor` x its speed (the CPU share the replicas had against the profiler's)."""
    return dataclasses.replace(
        profile,
        decode_tokens_per_s={b: r * factor for b, r in profile.decode_tokens_per_s.items()},
        prefill_tokens_per_s=profile.prefill_tokens_per_s * factor,
        source="projected",
        source_note=f"measured here, x{factor:.3f}: the CPU share during the run against during the measurement",
    )


def measure_profile(recipe: str, threads: int, slots: int, out: Path) -> Profile:
    sizes = ",".join(str(b) for b in (1, 2, 4, 8, 16, 32, 64) if b <= slots)
    command = [sys.executable, "-m", "tandem.cli", "profile", "--recipe", recipe, "--threads", str(threads),
               "--batch-sizes", sizes, "-o", str(out)]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return Profile.from_json(out.read_text())


def prompt_texts(lengths: list[int], seed: int) -> list[str]:
    """Held-out code, cut to each prompt's token count with the bundled tokenizer (no torch)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    files = json.loads((ROOT / "models" / "tandem-code-heldout-sample.json").read_text())["files"]
    ids = tokenizer.encode("\n\n".join(f["text"] for f in files), add_special_tokens=False).ids
    rng = random.Random(seed)
    texts = []
    for n in lengths:
        start = rng.randrange(len(ids) - n - 1)
        texts.append(tokenizer.decode(ids[start : start + n]))
    return texts


class ReplicaMeter:
    """Polls the gateway's tandem:replicas gauge; integrates replicas (every state) over time."""

    def __init__(self, url: str, interval_s: float = 0.25) -> None:
        self.url, self.interval_s = url, interval_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                try:
                    text = client.get(self.url + "/metrics").text
                    live = sum(
                        int(s.value)
                        for family in text_string_to_metric_families(text)
                        if family.name == "tandem:replicas"
                        for s in family.samples
                        if s.labels.get("variant") == NAME
                    )
                    self.samples.append((time.perf_counter(), live))
                except httpx.HTTPError:
                    pass
                self._stop.wait(self.interval_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def replica_seconds(self, start: float, end: float) -> float:
        total, points = 0.0, [(t, n) for t, n in self.samples]
        for (t0, n0), (t1, _) in zip(points, points[1:], strict=False):
            lo, hi = max(t0, start), min(t1, end)
            if hi > lo:
                total += n0 * (hi - lo)
        return total


async def replay(url: str, trace, texts: list[str], model: str) -> tuple[float, list]:
    """Send every request at its arrival time; returns (the start time, one record per request)."""
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as client:
        start = time.perf_counter()

        async def send(index: int) -> object:
            request = trace[index]
            await asyncio.sleep(max(0.0, start + request.arrival_s - time.perf_counter()))
            body = {"model": model, "prompt": texts[index], "max_tokens": request.output_tokens, "temperature": 0.0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
            return await one_request(client, url, body, index)

        records = await asyncio.gather(*(send(i) for i in range(len(trace))))
    return start, list(records)


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) used so far by a process and each of its children, from /proc."""
    tick = 100.0  # USER_HZ on Linux

    def used(p: int) -> float:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    out = {"gateway": used(pid)}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out[f"replica {stat.parent.name}"] = used(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


def drift(before: Profile, after: Profile) -> float:
    """The largest relative change of any measured speed between two Profiles of the same recipe."""
    pairs = [(before.decode_tokens_per_s[b], after.decode_tokens_per_s[b]) for b in before.decode_tokens_per_s]
    pairs.append((before.prefill_tokens_per_s, after.prefill_tokens_per_s))
    return max(abs(y / x - 1) for x, y in pairs)


def run_real(args, work: Path, deployment: dict, trace, texts: list[str], duration: float) -> dict:
    """The gateway (`tandem serve --deployment`) as a subprocess, the trace replayed against it."""
    (work / "deployment.json").write_text(json.dumps(deployment))
    spawned = time.perf_counter()
    proc, url = start_server(["--deployment", str(work / "deployment.json")], work / "gateway.log", timeout_s=600)
    boot_s = time.perf_counter() - spawned  # the gateway and its first replica, before any traffic
    meter = ReplicaMeter(url)
    meter.start()
    client_cpu = time.process_time()
    try:
        start, records = asyncio.run(replay(url, trace, texts, "m"))
        end = time.perf_counter()
        cpu = cpu_seconds(proc.pid) | {"client (this process)": time.process_time() - client_cpu}
    finally:
        meter.stop()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
    ok = [r for r in records if r.ok]
    met = sum(1 for r in ok if r.ttft_s <= args.slo_ttft_s and (r.tpot_s or 0.0) <= args.slo_tpot_s)
    return {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "error_samples": sorted({r.error for r in records if r.error})[:5],
        "replica_seconds": meter.replica_seconds(start, start + duration),
        "ttft_p50_s": median([r.ttft_s for r in ok]),
        "tpot_p50_s": median([r.tpot_s for r in ok if r.tpot_s is not None]),
        "slo_attainment": met / len(records),
        "peak_replicas": max((n for t, n in meter.samples if start <= t <= start + duration), default=0),
        "wall_s": end - start,
        "replica_boot_s": boot_s,
        "cpu_seconds": cpu,
        "replicas_over_time": [(round(t - start, 2), n) for t, n in meter.samples],
        "records": [
            (round(trace[r.client].arrival_s, 3), r.ttft_s and round(r.ttft_s, 4), round(r.e2e_s, 4), r.output_tokens)
            for r in records
        ],
    }


def run_sim(args, profile: Profile, serving: Profile, params: dict, trace, duration: float, boot_s: float) -> dict:
    """The same slice, Profile (the policy's, as the gateway had it), policy, limits and interval in
    tandem.sim. The replicas serve at `serving` (the Profile at the run's CPU share) and boot as long
    as the gateway's first one took here (a process start; the Profile counts only load + first token)."""
    config = SimConfig(tick_s=args.interval_s, ttft_slo_s=args.slo_ttft_s, tpot_slo_s=args.slo_tpot_s, warmup_s=0,
                       boot_s=boot_s)  # fmt: skip
    variant = Variant(NAME, profile.recipe, profile=profile)
    policy = make_policy("capacity", CapacityParams(**params))
    limits = ScaleLimits(1, args.max_replicas)
    sim = simulate(trace, variant, policy, limits, config=config, duration_s=duration, serving=serving)
    return {
        "requests": len(sim.requests),
        "lost": sim.lost,
        "unserved": sim.unserved,
        "replica_seconds": sim.replica_seconds,
        "ttft_p50_s": sim.quantile("ttft", 0.5),
        "tpot_p50_s": sim.quantile("tpot", 0.5),
        "slo_attainment": sim.slo_attainment,
        "peak_replicas": sim.peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="baseline")
    parser.add_argument("--start-s", type=float, default=600.0, help="where the slice starts in the trace")
    parser.add_argument("--duration-s", type=float, default=240.0, help="of the trace (before --load compresses it)")
    parser.add_argument("--load", type=float, default=1.3,
                        help="size the slice's rate to need this many replicas of the measured Profile")  # fmt: skip
    parser.add_argument("--max-replicas", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    parser.add_argument("--slots", type=int, default=16, help="--max-num-seqs of each replica")
    parser.add_argument("--slo-ttft-s", type=float, default=1.0)
    parser.add_argument("--slo-tpot-s", type=float, default=0.1)
    parser.add_argument("--interval-s", type=float, default=2.0, help="controller interval, both sides")
    parser.add_argument(
        "--max-drift",
        type=float,
        default=0.15,
        help="a run counts only if the Profiles measured before and after it differ by at most this",
    )
    parser.add_argument("--attempts", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "sim_validation.json")
    args = parser.parse_args()
    attempts = []
    for attempt in range(args.attempts):
        work = Path(tempfile.mkdtemp(prefix="tandem-sim-validate-"))
        load_before = Path("/proc/loadavg").read_text().split()[:3]
        probe = CpuShare()
        try:
            t0 = time.perf_counter()
            profile = measure_profile(args.recipe, args.threads, args.slots, work / "profile.json")
            share_before = probe.share(t0, time.perf_counter())
            sliced, length_scale = fit_context(load_trace(start_s=args.start_s, duration_s=args.duration_s),
                                               profile.max_model_len or 512)  # fmt: skip
            work_per_s = demand_series(sliced, profile, args.slo_tpot_s, args.duration_s, args.duration_s)[0][1]
            rate_scale = args.load / work_per_s
            trace, duration = compress(sliced, rate_scale), args.duration_s / rate_scale
            texts = prompt_texts([r.prompt_tokens for r in trace], args.seed)
            params = {"tpot_slo_s": args.slo_tpot_s, "ttft_slo_s": args.slo_ttft_s}
            deployment = {
                "model": str(MODEL),
                "threads": args.threads,
                "variants": [{"name": NAME, "recipe": profile.recipe, "profile": str(work / "profile.json"),
                              "replicas": {"min": 1, "max": args.max_replicas},
                              "args": ["--max-num-seqs", str(args.slots), "--served-model-name", "m"]}],
                "policy": {"name": "capacity", "interval_s": args.interval_s, "params": params},
            }  # fmt: skip
            print(f"attempt {attempt + 1}: {len(trace)} requests over {duration:.0f} s (trace {args.start_s:g}+"
                  f"{args.duration_s:g} s at x{rate_scale:.2f}, lengths x{length_scale:.3f}); {profile.recipe}: "
                  f"{profile.decode_tokens_per_s}", file=sys.stderr)  # fmt: skip
            t1 = time.perf_counter()
            real = run_real(args, work, deployment, trace, texts, duration)
            share_run = probe.share(t1 + real["replica_boot_s"], time.perf_counter())
            t2 = time.perf_counter()
            after = measure_profile(args.recipe, args.threads, args.slots, work / "profile_after.json")
            share_after = probe.share(t2, time.perf_counter())
        finally:
            probe.stop()
        # The replicas ran at the CPU share of the run; each Profile was measured at its own share.
        during = rescaled(profile, share_run / share_before)
        check = rescaled(after, share_run / share_after)
        simulated = run_sim(args, profile, during, params, trace, duration, real["replica_boot_s"])
        keys = ("replica_seconds", "ttft_p50_s", "slo_attainment")
        difference = {k: simulated[k] / real[k] - 1 if real[k] else None for k in keys}
        stationary = drift(during, check) <= args.max_drift
        attempts.append({
            "load_before": load_before,
            "load_after": Path("/proc/loadavg").read_text().split()[:3],
            "cpu_share": {"profile_before": share_before, "run": share_run, "profile_after": share_after},
            "profile": json.loads(profile.to_json()),
            "profile_after": json.loads(after.to_json()),
            "profile_simulated": json.loads(during.to_json()),
            "profile_drift": drift(during, check),
            "stationary": stationary,
            "trace": {"start_s": args.start_s, "duration_s": args.duration_s, "rate_scale": rate_scale,
                      "length_scale": length_scale, "requests": len(trace), "work_replicas": args.load},
            "deployment": deployment,
            "real": real,
            "simulated": simulated,
            "relative_difference": difference,
            "within_20_percent": all(v is not None and abs(v) <= 0.2 for v in difference.values()),
        })  # fmt: skip
        for key in ("replica_seconds", "ttft_p50_s", "tpot_p50_s", "slo_attainment", "peak_replicas"):
            print(f"  {key:16} real {real[key]:10.3f}  sim {simulated[key]:10.3f}", file=sys.stderr)
        print(f"  errors {real['errors']}, lost {simulated['lost']}, cpu share {share_before:.2f} / {share_run:.2f} / "
              f"{share_after:.2f}, drift {drift(during, check):.0%}, within 20%: "
              f"{attempts[-1]['within_20_percent']}", file=sys.stderr)  # fmt: skip
        if stationary:
            break
    payload = {
        "command": shlex.join([".venv/bin/python", *sys.argv]),
        "attempts": attempts,
        "counted": next((i for i, a in enumerate(attempts) if a["stationary"]), None),
        "attribution": ATTRIBUTION[CONVERSATION_TRACE],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
