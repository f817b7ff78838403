"""Seconds to plan: the search space, the exact one-stage solve, and the whole search with pipeline stages.

Usage::

    .venv/bin/python benchmarks/solve_time.py [--case torchvision:resnet50:64,3,2048,2048:1024 ...]
                                              [--profile h100] [--max-stages 16]

Each case is ``MODEL:N,C,H,W:DEVICES``; the defaults are the planner issue's:
torchvision ResNet-50 at 64×3×2048×2048 on 64, 1024 and 4096 devices and
ResNet-152 at 1024. Tracing is not counted (``parplan inspect`` measures it).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

from calibrate.presets import preset_cluster, preset_profile
from cost_models.ir.graph import parse_input_shape
from cost_models.ir.model_spec import load_model
from cost_models.ir.tracing import trace
from planner import ahead
from planner.search import plan_model
from planner.settings import SearchSettings
from planner.solvers.exact import solve_exact
from planner.space import build_space

DEFAULT_CASES = ("torchvision:resnet50:64,3,2048,2048:64", "torchvision:resnet50:64,3,2048,2048:1024",
                 "torchvision:resnet50:64,3,2048,2048:4096", "torchvision:resnet152:64,3,2048,2048:1024")


def run_case(case: str, preset: str, max_stages: int) -> None:
    """Print the search's size and seconds and the plan's prediction against the baselines for one case."""
    spec, shape_text, devices_text = case.rsplit(":", 2)
    devices = int(devices_text)
    graph = trace(load_model(spec), parse_input_shape(shape_text))
    profile, cluster = preset_profile(preset), preset_cluster(preset, devices)
    started = time.perf_counter()
    space = build_space(graph, profile, cluster, devices, memory_limit_bytes=cluster.memory_bytes)
    built = time.perf_counter()
    solution = solve_exact(space.table)
    solved = time.perf_counter()
    result = plan_model(graph, profile, cluster, SearchSettings(max_stages=max_stages))
    baselines = ", ".join(f"{b.name} {b.estimate.iteration_s * 1e3:.2f} ms "
                          f"({b.estimate.iteration_s / result.estimate.iteration_s:.2f}×)" for b in result.baselines)
    print(f"{spec} {shape_text} on {devices} {preset}: {len(space.candidates)} decisions, "
          f"{sum(map(len, space.candidates.values()))} candidates kept of {space.considered} "
          f"({space.pruned} pruned); one stage: space {built - started:.2f} s + solve {solved - built:.3f} s "
          f"({solution.solver}, {solution.status}); whole search up to {max_stages} stages "
          f"({len(result.considered)} plans priced, {result.skipped_configurations} configurations skipped by the "
          f"bound) {result.search_s:.2f} s")
    print(f"    plan: {result.plan.summary()}, predicted {result.estimate.iteration_s * 1e3:.2f} ms; {baselines}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", default=None)
    parser.add_argument("--profile", default="h100")
    parser.add_argument("--max-stages", type=int, default=SearchSettings().max_stages)
    parser.add_argument("--no-helper", action="store_true",
                        help="no helper process on the second core (planner.ahead): one core's figure")
    args = parser.parse_args()
    if args.no_helper:
        ahead.LEAST_WORK = sys.maxsize
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}")
    for case in args.case or DEFAULT_CASES:
        run_case(case, args.profile, args.max_stages)


if __name__ == "__main__":
    main()
