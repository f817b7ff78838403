"""Seconds of ``estimate`` for ResNet-50 at 64×3×2048×2048 on 64 devices of the ``h100`` preset.

Traces the model once, writes two hand-made plans (pure sample ``n64`` and
hybrid ``n16·h2·w2``), and times ``estimate`` on each (median of repeats,
imports and tracing excluded), printing the predictions too. Usage::

    .venv/bin/python benchmarks/estimate_speed.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torchvision

from calibrate.presets import preset_cluster, preset_profile
from cost_models.estimate import estimate
from cost_models.formats.plan import LayerAssignment, Pipeline, Plan
from cost_models.ir.tracing import trace
from cost_models.layout import Layout

SHAPE = (64, 3, 2048, 2048)


def make_plan(graph, devices: int, spatial: bool) -> Plan:  # noqa: ANN001
    """``n16·h2·w2`` on every layer whose output has rows to split (else ``n64``), or ``n64`` everywhere."""
    def layout(name: str) -> Layout:
        shape = graph.nodes[name]["output_shape"]
        if spatial and len(shape) == 4 and shape[2] >= 2:
            return Layout(n=devices // 4, h=2, w=2)
        return Layout(n=devices)
    return Plan(graph.fingerprint, SHAPE, "float32", preset_cluster("h100", devices),
                {name: LayerAssignment(layout(name)) for name in graph.compute_layers()}, Pipeline(1, (devices,)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    graph = trace(torchvision.models.resnet50(), SHAPE)
    profile = preset_profile("h100")
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}")
    for label, spatial in (("n64", False), ("n16·h2·w2", True)):
        plan = make_plan(graph, 64, spatial)
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            result = estimate(graph, plan, profile)
            times.append(time.perf_counter() - started)
        print(f"{label:<10} estimate {statistics.median(times):.3f} s (median of {args.repeats}); predicts "
              f"{result.iteration_s * 1e3:.1f} ms/iteration, {result.memory_bytes_max / 2**30:.2f} GiB/rank, "
              f"halo {result.breakdown_s['halo'] * 1e3:.2f} ms, "
              f"allreduce {result.breakdown_s['allreduce'] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
