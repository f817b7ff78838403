"""What a pipeline stage takes of the user's model (``runtime.pipeline.stage``): the placements of the values
crossing its cuts, its buffers, its compute dtype; the parameters of other stages released, shared ones refused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.fx import Node

from cost_models.errors import PlanError
from cost_models.formats.plan import Plan
from runtime.apply import parameters_of
from runtime.inputs import placeholder_placements
from runtime.pipeline.cut import StageCut
from runtime.placement import Placement, value_placement
from runtime.preflight import held_plan

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["activation_dtype", "buffers_of", "crossing_placements", "refuse_shared_parameters"]


def activation_dtype(model: nn.Module, plan: Plan) -> torch.dtype:
    """The dtype the model computes in: its first floating parameter's, else the plan's."""
    floating = (p.dtype for p in model.parameters() if p.is_floating_point())
    return next(floating, getattr(torch, plan.dtype))


def crossing_placements(nodes: Sequence[Node], cuts: Sequence[StageCut], plan: Plan,
                        graph: LayerGraph) -> dict[str, Placement]:
    """Each crossing's placement on the wire: its producer's (a model input's: the one the first stage loads it
    in, ``runtime.inputs``)."""
    held = {name: assignment.layout for name, assignment in held_plan(plan, nodes, graph).layers.items()}
    loaded = placeholder_placements(nodes, held, graph, plan.pipeline.devices_per_stage[0])
    return {crossing.name: value_placement(plan.layers[crossing.name].layout, graph.nodes[crossing.name])
            if crossing.name in plan.layers
            else loaded[crossing.name] for crossing in (c for cut in cuts for c in cut.sends)}


def refuse_shared_parameters(model: nn.Module, nodes: Sequence[Node], cuts: Sequence[StageCut]) -> None:
    """A parameter used on two stages would be trained twice; refuse the cut, naming it."""
    owner: dict[int, int] = {}
    for cut in cuts:
        members = set(cut.nodes)
        for param in parameters_of([node for node in nodes if node.name in members], model):
            if owner.setdefault(id(param), cut.index) != cut.index:
                name = next(n for n, p in model.named_parameters() if p is param)
                raise PlanError(f"parameter {name} is used on stages {owner[id(param)]} and {cut.index}; put the "
                                f"layers sharing it on one stage")


def buffers_of(names: Sequence[str], nodes: Sequence[Node], model: nn.Module) -> list[torch.Tensor]:
    """The buffers (batch-norm statistics, …) of the modules this stage's nodes call, each once."""
    members = set(names)
    found: dict[int, torch.Tensor] = {}
    for node in nodes:
        if node.name in members and node.op == "call_module":
            found.update((id(b), b) for b in model.get_submodule(str(node.target)).buffers())
    return list(found.values())


