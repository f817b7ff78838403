"""When a plan runs the traced program as it is: pure sample parallelism, as DDP runs it.

A single-stage plan whose every layer splits samples only, over all ranks of
the stage (``n{R}``), computes on each rank exactly the traced program on that
rank's samples — provided nothing in the program sees across samples: no
batch-norm synchronised over the batch (``sync_batchnorm``), no random op
(their masks are keyed draws of the unsplit batch, ``runtime.random_ops``),
no shape read that gives on the rank's box another value than on the unsplit
tensor (``runtime.shapes.local_reads_agree``), and every model input placed
as the layers read it. Then :class:`runtime.apply.DistributedModel` runs the
traced ``GraphModule``'s generated code instead of interpreting its nodes one
by one (no placements, no redistribution checks: about 4 ms of a 30 ms
ResNet-18 forward on this project's development machine), and gradients are
summed by ``runtime.gradsync`` as for any plan.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from torch.fx import Node

from cost_models.layout import Layout
from runtime.placement import Placement
from runtime.shapes import local_reads_agree

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["runs_directly"]


def runs_directly(nodes: Sequence[Node], graph: LayerGraph, layouts: Mapping[str, Layout],
                  input_placements: Sequence[Placement], *, ranks: int, member: int, sync_batchnorm: bool,
                  random: Collection[str]) -> bool:
    """Whether the whole traced program, run as written on this member's boxes, is this member's part of the plan.

    ``layouts``: every layer's layout (the held plan's); ``random``: the program's random ops.
    """
    samples = Layout(n=ranks)
    if random or any(layout != samples for layout in layouts.values()):
        return False
    if any(placement != Placement(samples) for placement in input_placements):
        return False
    if sync_batchnorm and ranks > 1 and any(graph.nodes[name].kind == "batchnorm" for name in layouts):
        return False
    return local_reads_agree(nodes, graph, layouts, member)
