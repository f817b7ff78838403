"""The runtime's own cost: ``apply_plan`` unsplit on one rank against the plain model, and a 2-rank spatial split
against the cost model's prediction.

Usage::

    .venv/bin/python benchmarks/runtime_overhead.py [--model torchvision:resnet18] [--shape 8,3,224,224]
                                                    [--steps 20] [--threads 2] [--split-shape 8,3,256,256]
                                                    [--calibrate-s 120] [--skip-split]

Part 1 times one training step (forward, loss, backward, SGD update) of the
plain model and of ``apply_plan`` with every layer unsplit, in one process,
interleaved step by step so drift hits both alike; it prints the medians and
the overhead (target ≤ 3%). Part 2 calibrates this machine for the model
(``parplan calibrate --ranks 2``), then runs ``parplan run --layout h2`` and
``--layout n2`` on 2 ranks (one thread each) with that profile and prints the
measured median step beside the prediction.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cost_models.cluster import Cluster, Link
from cost_models.ir.graph import parse_input_shape
from cost_models.ir.model_spec import load_model
from cost_models.ir.tracing import trace
from cost_models.layout import Layout
from cost_models.uniform import uniform_plan
from processes.heap import steady_heap
from runtime.apply import apply_plan

REPO = Path(__file__).resolve().parent.parent


def step_function(model: torch.nn.Module, x: torch.Tensor, target: torch.Tensor,
                  loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[], float]:
    """One timed training step of ``model``; returns its seconds."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> float:
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss(model(x), target).backward()
        optimizer.step()
        return time.perf_counter() - started

    return step


def unsplit_overhead(spec: str, shape: tuple[int, ...], steps: int) -> None:
    """Print the plain model's and apply_plan's median step and the overhead."""
    torch.manual_seed(0)
    plain = load_model(spec).train()
    graph = trace(plain, shape)
    torch.manual_seed(0)
    link = Link(0.0, 1e9)
    cluster = Cluster(devices=1, devices_per_node=1, memory_bytes=2**40, intra=link, inter=link)
    split = apply_plan(load_model(spec).train(), uniform_plan(graph, cluster, [Layout()]), graph=graph)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    out_shape = graph.nodes[graph.graph["outputs"][0]]["output_shape"]
    target = torch.zeros(out_shape[0], *out_shape[2:], dtype=torch.long)
    runs = {"plain model": step_function(plain, x, target, torch.nn.functional.cross_entropy),
            "apply_plan, unsplit": step_function(split, split.shard(x), target, split.loss)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(2):  # warm-up
        for run in runs.values():
            run()
    for _ in range(steps):
        for name, run in runs.items():
            times[name].append(run())
    medians = {name: statistics.median(values) for name, values in times.items()}
    base = medians["plain model"]
    for name, median in medians.items():
        spread = statistics.quantiles(times[name], n=10)
        print(f"  {name:22s} median {median * 1e3:8.1f} ms  (p10 {spread[0] * 1e3:.1f}, p90 {spread[-1] * 1e3:.1f})")
    print(f"  overhead of apply_plan: {(medians['apply_plan, unsplit'] / base - 1) * 100:+.2f}% (target ≤ 3%)")


def split_against_prediction(spec: str, shape_text: str, steps: int, calibrate_s: float) -> None:
    """Calibrate, run h2 and n2 on 2 ranks, print measured against predicted."""
    parplan = str(Path(sys.executable).parent / "parplan")
    with tempfile.TemporaryDirectory() as scratch:
        profile = Path(scratch) / "profile.json"
        started = time.perf_counter()
        subprocess.run([parplan, "calibrate", "--model", spec, "--input-shape", shape_text, "--ranks", "2",
                        "--budget-s", str(calibrate_s), "--out", str(profile), "--json"], check=True, cwd=REPO,
                       stdout=subprocess.DEVNULL)
        print(f"  calibrated this machine in {time.perf_counter() - started:.0f} s")
        for layout in ("h2", "w2", "n2"):
            document = _run(parplan, spec, shape_text, layout, steps, profile)
            measured, predicted = document["iteration_s"], document["predicted_iteration_s"]
            print(f"  {layout}: {document['plan']['summary']:28s} measured {measured * 1e3:8.1f} ms, predicted "
                  f"{predicted * 1e3:8.1f} ms, error {(predicted / measured - 1) * 100:+.1f}%", flush=True)


def _run(parplan: str, spec: str, shape_text: str, layout: str, steps: int, profile: Path) -> dict[str, Any]:
    result = subprocess.run([parplan, "run", "--model", spec, "--input-shape", shape_text, "--layout", layout,
                             "--nproc", "2", "--threads", "1", "--steps", str(steps), "--warmup", "2", "--profile",
                             str(profile), "--json"], check=True, cwd=REPO, capture_output=True, text=True)
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="torchvision:resnet18")
    parser.add_argument("--shape", default="8,3,224,224")
    parser.add_argument("--split-shape", default="8,3,256,256")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calibrate-s", type=float, default=120.0)
    parser.add_argument("--skip-split", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    steady_heap()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{args.threads} threads")
    print(f"1 rank, {args.model} {args.shape}, {args.steps} steps:")
    unsplit_overhead(args.model, parse_input_shape(args.shape), args.steps)
    if not args.skip_split:
        print(f"2 ranks (gloo, 1 thread each), {args.model} {args.split_shape}:")
        split_against_prediction(args.model, args.split_shape, max(5, args.steps // 2), args.calibrate_s)


if __name__ == "__main__":
    main()
