"""How fast `tandem sim` is: the whole one-hour conversation trace, 4 policies x 2 variants, timed.

The variants are Llama2-70B on A100 and on H100 (Profiles imported from the splitwise timings), so the
fleets are GPU-sized. Rounds run one after another on this shared machine; each is timed as a whole
(the CLI process, imports included) and reports simulated seconds per wall second. The goal: under
2 minutes for the 8 simulations.

    .venv/bin/python benchmarks/sim_speed.py --rounds 2      # -> results/sim_speed.json

Data: Azure LLM inference trace (conversation, 2023), CC-BY 4.0; Patel et al., "Splitwise", ISCA 2024.
Splitwise GPU timings, MIT License, Copyright (c) 2024 Pratyush Patel.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "sim_speed.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tandem-sim-speed-"))
    tandem = [sys.executable, "-m", "tandem.cli"]
    for hardware in ("a100-80gb", "h100-80gb"):
        subprocess.run([*tandem, "profile", "--from-splitwise", f"llama2-70b/{hardware}", "-o",
                        str(work / f"{hardware}.json")], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    command = [*tandem, "sim", "--trace", "conv", "--variant", f"a100={work / 'a100-80gb.json'}",
               "--variant", f"h100={work / 'h100-80gb.json'}", "--policies", "static-peak,hpa,kpa,capacity",
               "--slo-ttft-s", "2.5", "--slo-tpot-s", "0.15"]  # fmt: skip
    rounds = []
    for index in range(args.rounds):
        load = Path("/proc/loadavg").read_text().split()[:3]
        started = time.perf_counter()
        subprocess.run([*command, "--json", str(work / f"round{index}.json")], check=True, capture_output=True)
        wall = time.perf_counter() - started
        payload = json.loads((work / f"round{index}.json").read_text())
        simulated = sum(r["simulated_s"] for r in payload["results"])
        rounds.append({"load": load, "wall_s": wall, "simulations": len(payload["results"]),
                       "simulated_s": simulated, "simulated_s_per_wall_s": simulated / wall,
                       "per_pair_wall_s": {f"{r['variant']} x {r['policy']}": r["wall_s"]
                                           for r in payload["results"]}})  # fmt: skip
        print(f"round {index + 1}: {wall:.1f} s for {len(payload['results'])} simulations, "
              f"{simulated / wall:,.0f} simulated s per wall s (load {' '.join(load)})", file=sys.stderr)  # fmt: skip
    result = {
        "command": shlex.join([".venv/bin/python", *sys.argv]),
        "simulated_command": shlex.join(["tandem", *command[3:]]),
        "rounds": rounds,
        "under_2_minutes": all(r["wall_s"] < 120 for r in rounds),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
