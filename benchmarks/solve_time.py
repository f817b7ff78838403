"""Seconds to plan (one stage): building the search space, and each exact solve.

Usage::

    .venv/bin/python benchmarks/solve_time.py [--case examples/unet.py:unet:2,3,256,256:4 ...] [--profile a100]

Each case is ``MODEL:N,C,H,W:DEVICES``. The defaults are the sizes today's
search handles; the issue's targets (ResNet-50 at 64×3×2048×2048 on 64, 1024
and 4096 devices) need the faster edge costs and pruning still to come.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from calibrate.presets import preset_cluster, preset_profile
from cost_models.graph import parse_input_shape, trace
from cost_models.model_spec import load_model
from planner.ilp import solve_ilp
from planner.search import plan_one_stage
from planner.space import build_space

DEFAULT_CASES = ("examples/unet.py:unet:2,3,256,256:4", "torchvision:resnet18:8,3,224,224:4",
                 "torchvision:resnet18:8,3,224,224:8")


def run_case(case: str, preset: str) -> None:
    """Print build, solve and total planning seconds for one case."""
    spec, shape_text, devices_text = case.rsplit(":", 2)
    devices = int(devices_text)
    graph = trace(load_model(spec), parse_input_shape(shape_text))
    profile, cluster = preset_profile(preset), preset_cluster(preset, devices)
    started = time.perf_counter()
    space = build_space(graph, profile, cluster, devices, memory_limit_bytes=cluster.memory_bytes)
    built = time.perf_counter()
    solution = solve_ilp(space.table)
    solved = time.perf_counter()
    result = plan_one_stage(graph, profile, cluster)
    total = time.perf_counter() - solved
    best = min(b.estimate.iteration_s for b in result.baselines)
    print(f"{spec} {shape_text} on {devices} {preset}: {sum(map(len, space.candidates.values()))} candidates over "
          f"{len(space.candidates)} layers; space {built - started:.2f} s, one ILP {solved - built:.2f} s "
          f"({solution.status}); whole plan_one_stage {total:.2f} s; predicted {result.estimate.iteration_s * 1e3:.2f} ms "
          f"vs best baseline {best * 1e3:.2f} ms ({result.plan.summary()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", default=None)
    parser.add_argument("--profile", default="a100")
    args = parser.parse_args()
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}")
    for case in args.case or DEFAULT_CASES:
        run_case(case, args.profile)


if __name__ == "__main__":
    main()
