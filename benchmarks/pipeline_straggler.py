"""How much does a slow stage cost each pipeline schedule? Measured and predicted, on 2 CPU ranks.

Usage::

    python benchmarks/pipeline_straggler.py [--model torchvision:resnet18] [--input-shape 8,3,64,64]
                                            [--factor 2] [--steps 8] [--profile P | --calibrate-s 60] [--json]

Runs ``parplan run --layout n1 --nproc 2 --stages 2`` (one thread per rank)
with ``--schedule sync`` (1F1B, the default micro-batches) and ``--schedule
stale`` (DSP), each without a straggler and with ``--slow-stage 0:F`` and
``--slow-stage 1:F``, and prints per run the measured median seconds per batch
(for stale: between the last stage's updates), the prediction of a profile of
this machine for the same plan and slowdown (``parplan calibrate --ranks 2``
for ``--calibrate-s`` seconds unless ``--profile`` is given), the slowdown
relative to the same schedule without a straggler, and each stage's busy
fraction. ``--json`` prints ``runs[]`` with ``schedule``, ``slow_stage``,
``factor``, ``iteration_s``, ``predicted_iteration_s``, ``busy_fraction[]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PARPLAN = str(Path(sys.executable).parent / "parplan")


def run(model: str, shape: str, schedule: str, slow: str | None, steps: int, profile: str) -> dict[str, Any]:
    command = [PARPLAN, "run", "--model", model, "--input-shape", shape, "--layout", "n1", "--nproc", "2",
               "--stages", "2", "--schedule", schedule, "--threads", "1", "--steps", str(steps), "--warmup", "2",
               "--profile", profile, "--json", *(["--slow-stage", slow] if slow else [])]
    done = subprocess.run(command, check=True, cwd=REPO, capture_output=True, text=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="torchvision:resnet18")
    parser.add_argument("--input-shape", default="8,3,64,64")
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--profile")
    parser.add_argument("--calibrate-s", type=float, default=60.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="parplan-straggler-") as scratch:
        profile = args.profile or str(Path(scratch) / "profile.json")
        if not args.profile:
            subprocess.run([PARPLAN, "calibrate", "--model", args.model, "--input-shape", args.input_shape, "--ranks",
                            "2", "--budget-s", str(args.calibrate_s), "--out", profile, "--json"], check=True,
                           cwd=REPO, capture_output=True, text=True)
        for schedule in ("sync", "stale"):
            base = None
            for slow in (None, f"0:{args.factor:g}", f"1:{args.factor:g}"):
                document = run(args.model, args.input_shape, schedule, slow, args.steps, profile)
                found = {"schedule": schedule, "slow_stage": int(slow[0]) if slow else None,
                         "factor": args.factor if slow else 1.0, "iteration_s": document["iteration_s"],
                         "predicted_iteration_s": document["predicted_iteration_s"],
                         "busy_fraction": [s["busy_fraction"] for s in document["pipeline"]["per_stage"]],
                         "micro_batches": document["pipeline"]["micro_batches"]}
                base = base or found
                runs.append(found)
                if not args.json:
                    print(f"{schedule:5s} slow stage {found['slow_stage'] if slow else '-'}: "
                          f"{found['iteration_s'] * 1e3:8.1f} ms/batch measured "
                          f"({found['iteration_s'] / base['iteration_s']:.2f}× no straggler), "
                          f"{found['predicted_iteration_s'] * 1e3:8.1f} ms predicted "
                          f"({found['predicted_iteration_s'] / base['predicted_iteration_s']:.2f}×); busy "
                          + ", ".join(f"{b:.0%}" for b in found["busy_fraction"]), flush=True)
    if args.json:
        json.dump({"benchmark": "pipeline_straggler", "model": args.model, "input_shape": args.input_shape,
                   "runs": runs}, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
