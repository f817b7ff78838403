"""Prediction accuracy on this machine: a fresh calibration, then ``parplan validate`` per model and rank count.

For each model: ``parplan calibrate --ranks 4`` (the profile covers 1, 2 and 4
devices), then for each rank count ``parplan validate --plans K --per-layer
--refine``. Prints per plan the predicted and measured median iteration, and
per case the figures of the validation issue — median and p90 relative error,
Kendall's τ, regret of the planner's first choice — with the calibrated
profile as it is, and after refining (leave-one-out: each plan predicted by
corrections fitted without it), beside the targets (≤ 10%, ≤ 20%, ≥ 0.8,
≤ 5%). Usage::

    .venv/bin/python benchmarks/validation.py [--plans 6] [--steps 10] [--calibrate-s 240]
                                              [--ranks 2,4] [--only resnet18|unet] [--keep DIR]
                                              [--reuse-profiles]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = {
    "resnet18": ("torchvision:resnet18", "8,3,64,64"),
    "unet": ("examples/unet.py:unet", "4,3,128,128"),
}
TARGETS = {"median_rel_err": 0.10, "p90_rel_err": 0.20, "kendall_tau": 0.8, "regret": 0.05}
REPO = Path(__file__).resolve().parent.parent


def parplan(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the installed ``parplan``; exit with its error line if it fails."""
    command = [str(Path(sys.executable).with_name("parplan")), *args]
    result = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command[1:3])} failed: {result.stderr.strip().splitlines()[-1:]}")
    return result


def calibrate(spec: str, shape: str, budget_s: float, out: Path) -> dict:
    """A fresh profile of this machine for the model; returns its fit summary."""
    started = time.perf_counter()
    parplan("calibrate", "--model", spec, "--input-shape", shape, "--ranks", "4", "--budget-s", str(budget_s),
            "--out", str(out), "--json")
    profile = json.loads(out.read_text())
    fit = profile["fit"]
    print(f"  calibrated in {time.perf_counter() - started:.0f} s: {profile['meta']['problems_measured']}/"
          f"{profile['meta']['problems_total']} problems timed; compute fit median "
          f"{fit['compute']['median_rel_err']:.1%}, comm fit median {fit['comm']['median_rel_err']:.1%}")
    return profile


def validate(spec: str, shape: str, profile: Path, ranks: int, args: argparse.Namespace, directory: Path) -> dict:
    """One ``parplan validate`` run with refinement; returns its report."""
    out, refined = directory / f"report-{ranks}.json", directory / f"refined-{ranks}.json"
    started = time.perf_counter()
    parplan("validate", "--model", spec, "--input-shape", shape, "--profile", str(profile), "--nproc", str(ranks),
            "--plans", str(args.plans), "--steps", str(args.steps), "--per-layer", "--refine", str(refined),
            "--out", str(out), "--json")
    report = json.loads(out.read_text())
    report["wall_s"] = time.perf_counter() - started
    return report


def show(report: dict) -> None:
    """Per plan, then the figures before and after refining against the targets."""
    held_out = report["refine"]["held_out_predicted_s"]
    print(f"    {'plan':<34} {'layouts':<44} {'pred ms':>9} {'meas ms':>9} {'IQR':>7} {'error':>7} "
          f"{'refined':>9} {'error':>7}")
    for row, after in zip(report["plans"], held_out):
        print(f"    {row['name'][:34]:<34} {row['summary'][:44]:<44} {row['predicted_s'] * 1e3:9.1f} "
              f"{row['measured_s'] * 1e3:9.1f} {row['measured_iqr_s'] * 1e3:7.1f} {row['signed_err']:+7.1%} "
              f"{after * 1e3:9.1f} {(after - row['measured_s']) / row['measured_s']:+7.1%}")
    for label, figures in (("calibrated profile", report["refine"]["before"]),
                           ("refined (leave-one-out)", report["refine"]["after"])):
        print(f"    {label:<24} " + "  ".join(_figure(name, figures[name]) for name in TARGETS))
    corrections = report["refine"]["corrections"]
    print(f"    corrections: common factor {corrections['fitted_on']['common_factor']:.2f}, step "
          f"{corrections['step_overhead_s'] * 1e3:.1f} ms, per event {corrections['event_overhead_s'] * 1e3:.2f} ms, "
          f"allreduce exposed {corrections['allreduce_exposed_fraction']:.0%}; "
          "largest layer factors " + ", ".join(
              f"{k} {v:.2f}" for k, v in sorted(corrections["layer_scale"].items(), key=lambda kv: -kv[1])[:4]))
    print(f"    fastest measured: {report['best_measured']}; refined first choice: "
          f"{report['refine']['first_choice_after']}; wall {report['wall_s']:.0f} s")


def _figure(name: str, value: float | None) -> str:
    if value is None:
        return f"{name} n/a"
    target = TARGETS[name]
    met = value >= target if name == "kendall_tau" else value <= target
    text = f"{value:.2f}" if name == "kendall_tau" else f"{value:.1%}"
    return f"{name.replace('_rel_err', '')} {text}{'' if met else ' (miss)'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--calibrate-s", type=float, default=240.0)
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--only", choices=sorted(MODELS))
    parser.add_argument("--keep", metavar="DIR", help="keep profiles and reports here (default: a temporary folder)")
    parser.add_argument("--reuse-profiles", action="store_true",
                        help="use the profiles already in --keep DIR instead of calibrating again")
    args = parser.parse_args()
    print(f"machine: {platform.node()} {platform.machine()}, Python {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    directory = Path(args.keep or tempfile.mkdtemp(prefix="parplan-validation-"))
    directory.mkdir(parents=True, exist_ok=True)
    summary = {}
    for name, (spec, shape) in MODELS.items():
        if args.only and name != args.only:
            continue
        print(f"{name} at {shape}:")
        profile = directory / f"{name}-profile.json"
        if not (args.reuse_profiles and profile.exists()):
            calibrate(spec, shape, args.calibrate_s, profile)
        for ranks in (int(r) for r in args.ranks.split(",")):
            case = directory / name
            case.mkdir(exist_ok=True)
            report = validate(spec, shape, profile, ranks, args, case)
            print(f"  R = {ranks}, {len(report['plans'])} plans:")
            show(report)
            summary[f"{name} R={ranks}"] = {"before": report["refine"]["before"], "after": report["refine"]["after"]}
    (directory / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"reports and profiles in {directory}")


if __name__ == "__main__":
    main()
