"""The plain model's training step against ``runtime.apply.apply_plan`` with every layer whole, interleaved in one
process (``benchmarks/gpu_check.py --overhead``): the cost of running through parplan's runtime at all."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["overhead"]


def overhead(spec: str, shape_text: str, device: str, steps: int) -> dict[str, Any]:
    """Median training step of the plain model and of apply_plan with every layer whole, interleaved."""
    import torch

    from cost_models.ir.graph import parse_input_shape

    shape, target = parse_input_shape(shape_text), torch.device(device)
    plain, split, graph = _twins(spec, shape, target)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(target)
    out_shape = graph.nodes[graph.graph["outputs"][0]]["output_shape"]
    labels = torch.zeros(out_shape[0], *out_shape[2:], dtype=torch.long, device=target)
    runs = {"plain": _timed_step(plain, x, labels, torch.nn.functional.cross_entropy, target),
            "apply_plan": _timed_step(split, split.shard(x), labels, split.loss, target)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(steps + 3):  # 3 warm-up rounds; the order alternates so drift hits both alike
        for name in (list(runs) if round_ % 2 == 0 else list(runs)[::-1]):
            seconds = runs[name]()
            if round_ >= 3:
                times[name].append(seconds)
    return _overhead_figures(times, device)


def _twins(spec: str, shape: tuple[int, ...], device: Any) -> tuple[Any, Any, Any]:
    """The plain model and apply_plan's unsplit copy of it, with the same weights, on ``device``."""
    import torch

    from cost_models.cluster import Cluster, Link
    from cost_models.ir.model_spec import load_model
    from cost_models.ir.tracing import trace
    from cost_models.layout import Layout
    from cost_models.uniform import uniform_plan
    from runtime.apply import apply_plan

    torch.manual_seed(0)
    plain = load_model(spec).train()
    graph = trace(plain, shape)
    torch.manual_seed(0)
    copy = load_model(spec).train().to(device)
    link = Link(0.0, 1e9)
    cluster = Cluster(devices=1, devices_per_node=1, memory_bytes=2**40, intra=link, inter=link)
    split = apply_plan(copy, uniform_plan(graph, cluster, [Layout()]), graph=graph)
    return plain.to(device), split, graph


def _timed_step(model: Any, x: Any, labels: Any, loss: Callable[[Any, Any], Any], device: Any) -> Callable[[], float]:
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step() -> float:
        synchronize()
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss(model(x), labels).backward()
        optimizer.step()
        synchronize()
        return time.perf_counter() - started

    return step


def _overhead_figures(times: dict[str, list[float]], device: str) -> dict[str, Any]:
    plain, split = statistics.median(times["plain"]), statistics.median(times["apply_plan"])
    pairs = [b / a for a, b in zip(times["plain"], times["apply_plan"])]
    return {"device": device, "steps": len(times["plain"]), "plain_median_s": plain, "apply_plan_median_s": split,
            "ratio": split / plain, "ratio_of_pairs_median": statistics.median(pairs),
            "plain_step_s": times["plain"], "apply_plan_step_s": times["apply_plan"]}
