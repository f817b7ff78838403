"""The pre-flight of ``parplan run``: a plan refused before any rank starts, in one line, naming what and why.

:func:`check_plan` refuses a plan made for another model, input or device
count; :func:`check_runnable` every layer the runtime cannot execute under
its layout (``cost_models.capability.predicate``'s rules, the planner's too, on the
plan as the runtime holds it: :func:`held_plan`), the shape reads a rank's
box cannot make right (``runtime.shapes``), and pipeline stages that are not
contiguous in the traced program or that a value cannot cross (a tuple of
tensors, a constant under a split layout). ``runtime.apply`` asks the same on
every rank, for the layers of its stage.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.fx import Node

from cost_models.capability.predicate import plan_refusals
from cost_models.errors import PlanError
from cost_models.formats.plan import Plan, check_plan_for_graph
from cost_models.ir.tracing import symbolic_trace
from cost_models.layout import Layout
from runtime.layers import refusal
from runtime.random_ops import CREATIONS, random_ops
from runtime.shapes import (
    constant_nodes,
    module_attribute,
    shape_made_nodes,
    shape_refusals_by_layer,
    static_nodes,
    tensor_names,
)

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph
    from runtime.layers import Site
    from runtime.pipeline.cut import StageCut

__all__ = ["SHAPE_FALLBACK", "check_plan", "check_runnable", "held_plan", "refuse_shapes", "refuse_sites",
           "shape_fallbacks"]


def check_plan(plan: Plan, graph: LayerGraph, ranks: int, where: str = "the plan") -> None:
    """Refuse a plan made for another model or input, or for another number of ranks (all its stages' devices).

    Raises:
        PlanError: Naming both fingerprints, or both counts, and what to do.
    """
    if graph.fingerprint != plan.fingerprint:
        shapes = " and ".join(str(list(shape)) for shape in graph.input_shapes)
        autocast = f" under autocast to {graph.graph['amp']}" if graph.graph.get("amp") else ""
        precision = graph.graph["dtype"] + autocast
        raise PlanError(f"{where} was made for model fingerprint {plan.fingerprint}, but this model at input "
                        f"{shapes} ({precision}) traces to {graph.fingerprint}; make a new plan (with the same "
                        f"--dtype and --amp as the run)")
    check_plan_for_graph(plan, graph)
    devices = plan.used_devices
    if ranks != devices:
        raise PlanError(f"{where} is for {devices} devices but {ranks} ranks would run it; start {devices} ranks "
                        f"(--nproc {devices}) or make a plan for {ranks} devices")


def check_runnable(model: nn.Module, plan: Plan, graph: LayerGraph, leaf_modules: Sequence[str] = (), *,
                   sync_batchnorm: bool = False, verify: bool = False) -> None:
    """Refuse, before any rank starts, a plan with a layer this runtime cannot execute under its layout.

    The rules are ``cost_models.capability.predicate``'s, the planner's too. ``sync_batchnorm`` is the training run's
    setting; ``verify`` adds the checks of ``--verify``'s run (batch-norm synchronised).

    Raises:
        PlanError: Naming up to three such layers, their layouts and why; a pipeline the runtime cannot run;
            or pipeline stages that are not contiguous in the traced program.
    """
    nodes = list(symbolic_trace(model, tuple(leaf_modules), shapes=graph.input_shapes).graph.nodes)
    held = held_plan(plan, nodes, graph)
    refused = list(dict.fromkeys([*plan_refusals(held, graph, sync_batchnorm=sync_batchnorm),
                                  *(plan_refusals(held, graph, sync_batchnorm=True) if verify else ())]))
    if refused:
        raise PlanError(f"this runtime cannot execute {len(refused)} layer(s) of the plan: {'; '.join(refused[:3])}"
                        f"; give those layers a layout it supports (e.g. split them by sample only)")
    refuse_shapes(nodes, model, held, graph, max(plan.pipeline.devices_per_stage))  # every member of any stage
    if plan.pipeline.stages > 1:  # stages must be contiguous in the traced program (named if not)
        from runtime.pipeline.cut import cut_stages

        cuts = cut_stages(nodes, {name: a.stage for name, a in plan.layers.items()}, plan.pipeline.stages,
                          static=frozenset(node.name for node in static_nodes(nodes, tensor_names(graph))))
        _refuse_split_constant_crossings(cuts, plan, held)
        _refuse_tuple_crossings(cuts, graph)


def _refuse_tuple_crossings(cuts: Sequence[StageCut], graph: LayerGraph) -> None:
    """The pipeline sends one tensor per crossing value: a layer's tuple of tensors (``x.chunk(2, dim=1)``)
    cannot cross a cut (``runtime.pipeline.stage``)."""
    single = tensor_names(graph)
    crossing = [c.name for cut in cuts for c in cut.sends if c.name in graph.nodes and c.name not in single]
    if crossing:
        shape = graph.nodes[crossing[0]].output_shape
        raise PlanError(f"layer(s) {', '.join(crossing[:3])} with several output tensors (e.g. {shape}) cross a "
                        f"pipeline cut, and a pipeline sends one tensor per value; move the cut after the layers "
                        f"reading their items (getitem), or plan with --max-stages 1")


def _refuse_split_constant_crossings(cuts: Sequence[StageCut], plan: Plan, held: Plan) -> None:
    """A constant layer (or one made from shapes) is computed whole; crossing a pipeline cut it travels as its
    plan's layout places it."""
    crossing = [c.name for cut in cuts for c in cut.sends
                if c.name in plan.layers and plan.layers[c.name].layout != held.layers[c.name].layout]
    if crossing:
        raise PlanError(f"layer(s) {', '.join(crossing[:3])} computed from parameters or shapes alone cross a "
                        f"pipeline cut under a split layout; give them n1 or move the cut next to the layers reading "
                        f"them")


def held_plan(plan: Plan, nodes: Sequence[Node], graph: LayerGraph) -> Plan:
    """``plan`` as the runtime executes it: constant layers and layers made from shapes alone
    (``runtime.shapes.constant_nodes``, ``shape_made_nodes``) whole (``n1``)."""
    layers_of = frozenset(graph.nodes)
    whole = constant_nodes(nodes, layers_of) | shape_made_nodes(nodes, layers_of, tensor_names(graph))
    layers = {name: (replace(assignment, layout=Layout()) if name in whole else assignment)
              for name, assignment in plan.layers.items()}
    return replace(plan, layers=layers)


def refuse_shapes(nodes: list[Node], model: nn.Module, plan: Plan, graph: LayerGraph, size: int) -> None:
    """Refuse ops given sizes or shape-derived values this runtime cannot make right on a rank's box."""
    refused = list(dict.fromkeys(reason for reasons in _shape_refusals(nodes, model, plan, graph, size).values()
                                 for reason in reasons))
    if refused:
        raise PlanError(f"this runtime cannot execute {len(refused)} layer(s) of the plan: {'; '.join(refused[:3])}")


SHAPE_FALLBACK = "a size it takes is read from the shape of a tensor its split would cut: runs whole"
"""Why :func:`shape_fallbacks` left a layer whole."""


def shape_fallbacks(model: nn.Module, plan: Plan, graph: LayerGraph,
                    leaf_modules: Sequence[str] = ()) -> tuple[Plan, list[str]]:
    """``plan`` with each layer whose split a shape-derived size makes wrong run whole (``n1``) instead, and
    those layers — ``parplan run --layout``'s and ``parplan check``'s per-layer fallback (a whole layer reads
    the unsplit program's sizes: ``torch.fft.irfft2(…, s=y.shape[-2:])`` of a row tile); what remains refused,
    :func:`check_runnable` names."""
    nodes = list(symbolic_trace(model, tuple(leaf_modules), shapes=graph.input_shapes).graph.nodes)
    whole: list[str] = []
    for _ in range(len(plan.layers)):
        size = max(plan.pipeline.devices_per_stage)
        refused = [name for name in _shape_refusals(nodes, model, held_plan(plan, nodes, graph), graph, size)
                   if name in plan.layers and plan.layers[name].layout.ranks > 1]
        if not refused:
            break
        whole += refused
        plan = replace(plan, layers={name: replace(assignment, layout=Layout()) if name in refused else assignment
                                     for name, assignment in plan.layers.items()})
    return plan, whole


def _shape_refusals(nodes: list[Node], model: nn.Module, plan: Plan, graph: LayerGraph,
                    size: int) -> dict[str, list[str]]:
    def whole_shape(node: Node) -> tuple[int, ...] | None:
        value = module_attribute(model, str(node.target)) if node.op == "get_attr" else None
        return tuple(value.shape) if isinstance(value, torch.Tensor) else None

    layouts = {name: assignment.layout for name, assignment in plan.layers.items()}
    creations = [name for name, op in random_ops(nodes, model).items() if op.form in CREATIONS]
    return shape_refusals_by_layer(nodes, graph, layouts, size, whole_shape, localised=creations)


def refuse_sites(sites: Iterable[Site]) -> None:
    """Refuse a plan with a layer (a ``runtime.layers.Site``) this runtime cannot execute in its layout, naming
    the first three and why.

    Raises:
        PlanError: Some site's layout is refused by the capability predicate.
    """
    refused = [f"'{site.name}' ({site.kind}, {site.layout}): {why}" for site in sites if (why := refusal(site))]
    if refused:
        raise PlanError(f"this runtime cannot execute {len(refused)} layer(s) of the plan: {'; '.join(refused[:3])}"
                        f"; give those layers a layout it supports (e.g. split them by sample only)")
