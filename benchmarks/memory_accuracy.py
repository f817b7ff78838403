"""Peak memory per rank, measured against the prediction, per model and uniform layout, on this machine.

For each model: ``parplan calibrate --ranks 2 --no-forms`` (kernel times and
each kernel's peak bytes; or ``--profile P`` to reuse one), then per layout
``parplan run --layout L --nproc R --steps 2 --warmup 1 --profile P``; the
run measures its peak apart from the cost model (``runtime.memory_peak``:
held tensors plus ``torch.profiler``'s allocations over one step) and reports
the plan's prediction beside it. Prints a table and the largest error
(issue 21's target: within 10 %). Usage::

    .venv/bin/python benchmarks/memory_accuracy.py [--only resnet18|unet] [--layouts n1,n2,h2,w2,c2]
                                                   [--calibrate-s 60] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
from math import prod
from pathlib import Path

MODELS = {
    "resnet18": ("torchvision:resnet18", "8,3,64,64"),
    "unet": ("examples/unet.py:unet", "4,3,128,128"),
}
REPO = Path(__file__).resolve().parent.parent
TARGET = 0.10


def parplan(*args: str) -> None:
    """Run the installed ``parplan``; exit with its error line if it fails."""
    command = [str(Path(sys.executable).with_name("parplan")), *args]
    result = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
    if result.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{result.stderr.strip().splitlines()[-1:]}")


def measure(model: str, shape: str, layout: str, profile: Path, out: Path) -> dict[str, float]:
    """One run of ``layout``: its measured and predicted peak bytes per rank."""
    ranks = prod(int(part) for part in re.findall(r"\d+", layout)) or 1
    parplan("run", "--model", model, "--input-shape", shape, "--layout", layout, "--nproc", str(ranks),
            "--steps", "2", "--warmup", "1", "--profile", str(profile), "--out", str(out))
    return json.loads(out.read_text())["memory"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(MODELS))
    parser.add_argument("--layouts", default="n1,n2,h2,w2,c2")
    parser.add_argument("--calibrate-s", type=int, default=60)
    parser.add_argument("--keep", type=Path, help="keep the profiles and measurements here")
    args = parser.parse_args()
    print(f"# {' '.join(sys.argv)}\n# {platform.node()}, {platform.processor() or platform.machine()}")
    work = args.keep or Path(tempfile.mkdtemp(prefix="parplan-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    worst = 0.0
    for name, (model, shape) in MODELS.items():
        if args.only and name != args.only:
            continue
        profile = work / f"{name}.json"
        parplan("calibrate", "--model", model, "--input-shape", shape, "--ranks", "2", "--no-forms",
                "--budget-s", str(args.calibrate_s), "--out", str(profile))
        for layout in args.layouts.split(","):
            memory = measure(model, shape, layout, profile, work / f"{name}-{layout}.json")
            worst = max(worst, abs(memory["rel_err"]))
            print(f"{name:10} {shape:>12} {layout:>4}  measured {memory['peak_bytes'] / 2**20:7.1f} MiB  "
                  f"predicted {memory['predicted_bytes'] / 2**20:7.1f} MiB  error {100 * memory['rel_err']:+6.1f} %")
    print(f"largest error {100 * worst:.1f} % (target within {100 * TARGET:.0f} %)")


if __name__ == "__main__":
    main()
