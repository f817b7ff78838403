"""Wall time and peak memory of `parplan inspect` (the issue-2 acceptance figures).

Runs the installed console script in a child process, as a user would, a few
times, and prints the median wall time (torch import included) and the peak
resident memory of the child. Usage::

    .venv/bin/python benchmarks/inspect_speed.py [--model torchvision:resnet50]
        [--input-shape 64,3,2048,2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def measure_once(model: str, shape: str) -> tuple[float, dict]:
    """One run of the console script: (wall seconds, parsed JSON document)."""
    script = Path(sys.executable).with_name("parplan")
    started = time.perf_counter()
    result = subprocess.run([str(script), "inspect", "--model", model, "--input-shape", shape, "--json"],
                            capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"parplan inspect failed: {result.stderr.strip()}")
    return elapsed, json.loads(result.stdout)


def children_peak_bytes() -> int:
    """Largest peak resident memory of any child this process has waited for."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="torchvision:resnet50")
    parser.add_argument("--input-shape", default="64,3,2048,2048")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    walls = []
    for _ in range(args.repeats):
        wall, document = measure_once(args.model, args.input_shape)
        walls.append(wall)
    totals = document["totals"]
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"parplan inspect --model {args.model} --input-shape {args.input_shape} --json")
    print(f"  wall time     median {statistics.median(walls):.2f} s  (min {min(walls):.2f}, max {max(walls):.2f}, "
          f"n={len(walls)})")
    print(f"  peak RSS      {children_peak_bytes() / 2**30:.2f} GiB (largest of the runs)")
    timing = document["timing_s"]
    print(f"  inside        import+build model {timing['load']:.2f} s, trace {timing['trace']:.2f} s")
    print(f"  layers {totals['layers']}, parameters {totals['params']:,}, "
          f"forward {totals['flops_fwd'] / 1e12:.1f} TFLOP, activations {totals['activation_bytes'] / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
