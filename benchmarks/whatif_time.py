"""How long does a 13-size what-if sweep take? ResNet-50 at 64×3×2048×2048 on the h100 preset, 1 … 4096 devices.

Usage::

    python benchmarks/whatif_time.py [--model torchvision:resnet50] [--input-shape 64,3,2048,2048]
                                     [--profile h100] [--devices 1..4096] [--jobs 0] [--repeats 1] [--json]

Runs ``parplan whatif … --json`` as a user would (a fresh process: importing
torch and tracing included) and prints its wall time per repeat and the
median, and the sweep's rows (devices, predicted iteration, speedup, plan).
Target: at most 20 s on the 2-core development machine (issue 23).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PARPLAN = str(Path(sys.executable).parent / "parplan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="torchvision:resnet50")
    parser.add_argument("--input-shape", default="64,3,2048,2048")
    parser.add_argument("--profile", default="h100")
    parser.add_argument("--devices", default="1..4096")
    parser.add_argument("--jobs", default="0")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    walls, document = [], None
    for _ in range(args.repeats):
        started = time.perf_counter()
        done = subprocess.run([PARPLAN, "whatif", "--model", args.model, "--input-shape", args.input_shape,
                               "--profile", args.profile, "--devices", args.devices, "--jobs", args.jobs, "--json"],
                              check=True, cwd=REPO, capture_output=True, text=True)
        walls.append(time.perf_counter() - started)
        document = json.loads(done.stdout)
    rows = document["rows"]  # type: ignore[index]
    result = {"benchmark": "whatif_time", "model": args.model, "input_shape": args.input_shape,
              "profile": args.profile, "sizes": len(rows), "wall_s": walls, "median_wall_s": statistics.median(walls),
              "planning_s": [row["search_s"] for row in rows], "rows": rows}
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
        return
    print(f"{len(rows)} sizes in {statistics.median(walls):.1f} s (median of {len(walls)}: "
          + ", ".join(f"{w:.1f}" for w in walls) + " s); target ≤ 20 s")
    feasible = [row for row in rows if row["feasible"]]
    times = [row["iteration_s"] for row in feasible]
    print(f"non-increasing: {'yes' if times == sorted(times, reverse=True) else 'NO'}; every row its own size's "
          f"search: {'yes' if all(row.get('found_at') == row['devices'] for row in feasible) else 'NO'}")
    for row in rows:
        if row["feasible"]:
            print(f"  {row['devices']:5d} devices: {row['iteration_s'] * 1e3:9.2f} ms, "
                  f"speedup {_times(row['speedup'])}, {_times(row['speedup_vs_sample'])} over pure sample, "
                  f"planned in {row['search_s']:.1f} s: "
                  f"{row['plan']}{_idle(row)}")
        else:
            print(f"  {row['devices']:5d} devices: infeasible — {row['reason']}")


def _idle(row: dict) -> str:
    """Where the plan leaves devices idle: on how many it runs."""
    used = row.get("devices_used") or row["devices"]
    return f" (on {used} of them)" if used < row["devices"] else ""


def _times(ratio: float | None) -> str:
    """``12.34×``, or ``—`` where there is no reference (one device cannot hold the model)."""
    return "—" if ratio is None else f"{ratio:.2f}×"


if __name__ == "__main__":
    main()
