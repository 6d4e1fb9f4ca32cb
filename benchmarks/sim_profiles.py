"""Every recipe's Profile of the bundled model, measured here for `tandem sim`, in rounds.

`tandem profile --threads 1` (one core per replica: co-located replicas each get a core, and one
thread is what a replica gets under `tandem serve` with several replicas), every recipe once per
round, rounds interleaved. This machine is shared and the kernel divides its CPU between
sessions, so a busy single-threaded probe in its own session runs throughout: each measurement's
speeds are divided by the CPU share the probe got meanwhile (the Profile at a whole core; the
share is written into the Profile's note), and each recipe keeps its fastest normalized round.

    .venv/bin/python benchmarks/sim_profiles.py --rounds 2     # -> results/profiles/cpu-<recipe>.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sim_validate import CpuShare

from tandem.contracts import Profile

RESULTS = Path(__file__).resolve().parent / "results"
RECIPES = ("baseline", "int8+kv-bf16+ngram", "bf16", "int8", "kv-bf16", "ngram", "speculative", "int8+ngram",
           "int8+speculative")  # fmt: skip


def normalized(measured: Profile, share: float) -> Profile:
    return dataclasses.replace(
        measured,
        decode_tokens_per_s={b: r / share for b, r in measured.decode_tokens_per_s.items()},
        prefill_tokens_per_s=measured.prefill_tokens_per_s / share,
        ttft_s_p50=measured.ttft_s_p50 * share,
    )


def fastest(rounds: list[tuple[Profile, float]]) -> Profile:
    """Each number's fastest normalized round; the rest of the Profile from the first round."""
    profiles = [normalized(p, share) for p, share in rounds]
    first = profiles[0]
    shares = ", ".join(f"{share:.2f}" for _, share in rounds)
    return dataclasses.replace(
        first,
        decode_tokens_per_s={b: max(p.decode_tokens_per_s[b] for p in profiles) for b in first.decode_tokens_per_s},
        prefill_tokens_per_s=max(p.prefill_tokens_per_s for p in profiles),
        ttft_s_p50=min(p.ttft_s_p50 for p in profiles),
        cold_start_s=min(p.cold_start_s for p in profiles),
        source_note=f"measured by `tandem profile --threads 1` in {len(rounds)} rounds on this shared machine at CPU "
        f"shares {shares} (probe); speeds divided by the share (one whole core), each number's fastest round",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=None, help="add to (and rebuild from) a previous run's rounds")
    parser.add_argument("--out-dir", type=Path, default=RESULTS / "profiles")
    args = parser.parse_args()
    recipes = [r for r in args.recipes.split(",") if r]
    log_path = args.out_dir / "cpu-measurements.json"
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tandem-profiles-"))
    log = json.loads(log_path.read_text())["runs"] if args.work_dir else []
    first = max((run["round"] for run in log), default=-1) + 1
    probe = CpuShare()
    try:
        for round_ in range(first, first + args.rounds):
            for recipe in recipes:
                start = time.perf_counter()
                subprocess.run([sys.executable, "-m", "tandem.cli", "profile", "--recipe", recipe, "--threads",
                                "1", "-o", str(work / f"{recipe}-{round_}.json")], check=True,
                               stdout=subprocess.DEVNULL)  # fmt: skip
                share = probe.share(start, time.perf_counter())
                log.append({"recipe": recipe, "round": round_, "cpu_share": share,
                            "load": Path("/proc/loadavg").read_text().split()[:3]})  # fmt: skip
                print(f"round {round_ + 1} {recipe}: CPU share {share:.2f}", file=sys.stderr)
    finally:
        probe.stop()
    recipes = sorted({run["recipe"] for run in log})
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for recipe in recipes:
        rounds = [(Profile.from_json((work / f"{recipe}-{run['round']}.json").read_text()), run["cpu_share"])
                  for run in log if run["recipe"] == recipe]  # fmt: skip
        (args.out_dir / f"cpu-{recipe}.json").write_text(fastest(rounds).to_json() + "\n")
    log_path.write_text(json.dumps({"command": " ".join(sys.argv), "runs": log}, indent=2) + "\n")


if __name__ == "__main__":
    main()
