"""The micro-batches ``parplan run --layout L --stages K`` takes by default leave every batch-norm more than one
value per channel (``cost_models.uniform.default_micro_batches``): resnet18 at 32×32 ends at 1×1, where a
micro-batch of one sample would be refused — every stage count was, before."""

from __future__ import annotations

import pytest
import torch

from calibrate.presets import preset_cluster
from cost_models.ir.model_spec import load_model
from cost_models.ir.tracing import trace
from cost_models.layout import Layout
from cost_models.uniform import balanced_starts, default_micro_batches, staged, uniform_plan
from runtime.preflight import check_runnable


@pytest.mark.parametrize(("spec", "shape", "layout", "expected"), [
    ("torchvision:resnet18", (4, 3, 32, 32), Layout(), 2),  # layer4 at 1×1: two samples a micro-batch
    ("torchvision:resnet18", (4, 3, 64, 64), Layout(), 4),  # 2×2 at the end: one sample is enough
    ("torchvision:resnet18", (8, 3, 32, 32), Layout(n=2), 2),  # each of 2 sample parts needs two at 1×1
])
def test_default_micro_batches(spec: str, shape: tuple[int, ...], layout: Layout, expected: int) -> None:
    graph = trace(load_model(spec), shape, torch.float32)
    plan = uniform_plan(graph, preset_cluster("h100", layout.ranks), [layout])
    micro = default_micro_batches(plan, graph, 2)
    assert micro == expected
    check_runnable(load_model(spec), staged(plan, graph, balanced_starts(graph, 2), "sync", micro), graph)
