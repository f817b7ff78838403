"""Calibration on this machine: wall time against the budget, and the held-out fit errors.

Runs the installed ``parplan calibrate`` as a user would, then prints the
figures of issue 3 (compute-fit and collective-fit median/p90 relative error
on held-out problems, wall time vs budget) per run and their medians. Usage::

    .venv/bin/python benchmarks/calibration_fit.py [--model torchvision:resnet18] [--input-shape 8,3,64,64]
                                                   [--ranks 2] [--budget-s 90] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def calibrate_once(args: argparse.Namespace, out: Path) -> tuple[float, dict]:
    """One ``parplan calibrate`` run; returns its wall seconds and the profile document."""
    script = Path(sys.executable).with_name("parplan")
    command = [str(script), "calibrate", "--model", args.model, "--input-shape", args.input_shape,
               "--ranks", str(args.ranks), "--budget-s", str(args.budget_s), "--out", str(out), "--json"]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"parplan calibrate failed: {result.stderr.strip()}")
    return wall_s, json.loads(out.read_text())


def describe(wall_s: float, profile: dict, budget_s: float) -> dict[str, float]:
    """The figures of one run."""
    fit, meta = profile["fit"], profile["meta"]
    print(f"  wall {wall_s:.1f} s for a budget of {budget_s:g} s (calibration itself {meta['calibration_s']:.1f} s); "
          f"{meta['problems_measured']}/{meta['problems_total']} problems timed, "
          f"{len(profile['comm']['samples'])} collective samples")
    print(f"  compute fit: median {fit['compute']['median_rel_err']:.1%}, p90 {fit['compute']['p90_rel_err']:.1%}, "
          f"n={fit['compute']['n']}")
    print(f"  comm fit:    median {fit['comm']['median_rel_err']:.1%}, p90 {fit['comm']['p90_rel_err']:.1%}, "
          f"n={fit['comm']['n']}")
    for comm in profile["comm"]["fits"]:
        print(f"    {comm['collective']:<15} α {comm['alpha_s'] * 1e6:7.1f} µs   "
              f"1/β {1 / comm['beta_s_per_byte'] / 1e9:6.2f} GB/s"
              if comm["beta_s_per_byte"] else f"    {comm['collective']:<15} α {comm['alpha_s'] * 1e6:7.1f} µs")
    return {"wall_s": wall_s, "compute": fit["compute"]["median_rel_err"], "compute_p90": fit["compute"]["p90_rel_err"],
            "comm": fit["comm"]["median_rel_err"], "comm_p90": fit["comm"]["p90_rel_err"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="torchvision:resnet18")
    parser.add_argument("--input-shape", default="8,3,64,64")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=90.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"parplan calibrate --model {args.model} --input-shape {args.input_shape} --ranks {args.ranks} "
          f"--budget-s {args.budget_s:g}")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for run in range(args.runs):
            print(f"run {run + 1}/{args.runs}")
            wall_s, profile = calibrate_once(args, Path(scratch) / f"profile{run}.json")
            rows.append(describe(wall_s, profile, args.budget_s))
    print("median over runs: " + ", ".join(f"{key} {statistics.median(r[key] for r in rows):.3g}" for key in rows[0]))


if __name__ == "__main__":
    main()
