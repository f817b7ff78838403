"""What a call the trace did not shape returns (``runtime._values.Held``) meeting tensors of another order.

timm's MViTv2 hands each block's attention the ``feat_size`` list the previous attention returned (a call
torch.fx cannot trace, so its tuple result is held as computed, under the sample split of the 4-D map it was
made from), beside its 3-D channels-last tokens. The two placements differ only in their order, and the
runtime refused the plan's own ``n2`` (zoo run: ``reads results of calls the trace did not shape computed under
n2 and n1``). Now the call runs in the held value's placement, the tensors fetched to it, and equals the unsplit
model in float64 on two ranks.

Since the trace takes Python decisions on shapes (issue 53), MViTv2's attention is traced through: its relative
positions are ``torch.einsum`` (an opaque call) of the split queries with a table indexed by ``torch.arange(q_h)`` —
a tensor made from shapes alone, whole on every rank, whose first dimension holds no samples. Under ``n2`` those
calls run whole (``runtime.shapes``: ``--layout``'s per-layer fallback); they failed after the ranks started,
the table cut as if by samples.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from distributed import run_ranks
from runtime_check import split_step_matches

from cost_models.layout import Layout

SHAPE = (4, 3, 32, 32)


def small_mvitv2() -> Any:
    """timm's MultiScaleVit with mvitv2_tiny's four stages (the last a 1×1 map at 32², as in the zoo run) and a
    block or two of 8–16 channels each."""
    from timm.models.mvitv2 import MultiScaleVit, MultiScaleVitCfg

    cfg = MultiScaleVitCfg(depths=(1, 1, 1, 2), embed_dim=(8, 8, 16, 16), num_heads=(1, 1, 2, 2))  # last: 1×1
    torch.manual_seed(0)
    return MultiScaleVit(cfg, img_size=SHAPE[-1], num_classes=5).double()


def _plan(world: int) -> tuple[Any, Any]:
    from cost_models.cluster import Cluster, Link
    from cost_models.ir.tracing import trace
    from cost_models.uniform import uniform_plan

    graph = trace(small_mvitv2(), SHAPE, torch.float64)
    link = Link(1e-6, 1e9)
    cluster = Cluster(devices=world, devices_per_node=world, memory_bytes=2**34, intra=link, inter=link)
    return uniform_plan(graph, cluster, [Layout.parse("n2"), Layout()]), graph


def _case(rank: int, world: int) -> dict[str, str]:
    from runtime.preflight import shape_fallbacks

    plan, graph = _plan(world)
    plan, whole = shape_fallbacks(small_mvitv2(), plan, graph)  # as parplan run --layout runs it
    assert whole and all(name.startswith("einsum") for name in whole), whole
    split_step_matches(small_mvitv2, plan, graph, SHAPE, "MViTv2 under n2")
    return {layer: str(assignment.layout) for layer, assignment in plan.layers.items()}


@pytest.mark.multirank
def test_mvitv2s_held_feature_sizes_run_under_a_sample_split() -> None:
    layouts = run_ranks(_case, 2, timeout_s=300)[0]
    assert sum(layout == "n2" for layout in layouts.values()) > len(layouts) // 2  # most layers split the batch
