"""Plans written by rule rather than searched: one preferred layout list for every layer.

Used to run a chosen split as it is (``parplan run --layout n2·h2``) and by
the runtime's tests and benchmarks. Each layer takes the first layout of its
preference list that it can take (:func:`layout_applies`: the rules of the
planner's search space), so a rule such as ``[h4, h2, n1]`` splits every
layer that is tall enough into four rows and keeps the rest whole (copies on
every rank).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import accumulate
from typing import TYPE_CHECKING

from cost_models.capability.predicate import layer_refusal, uncuttable_after
from cost_models.cluster import Cluster
from cost_models.errors import InputError
from cost_models.formats.plan import LayerAssignment, Pipeline, Plan, Schedule, recorded_shapes
from cost_models.ir.layer import Layer
from cost_models.layout import Layout
from cost_models.local_problem import local_problem

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["NO_COMPUTE_KINDS", "balanced_starts", "cut_places", "default_micro_batches", "fits_output",
           "layout_applies", "layout_by_rule", "staged", "uniform_plan"]

NO_COMPUTE_KINDS = frozenset({"flatten", "view", "getitem", "identity"})
"""Kinds with no local problem of their own: any layout their output fits is theirs."""

Rule = Callable[[str, int], Sequence[Layout]]  # (layer name, position in execution order) -> preferences


def layout_applies(node: Layer, layout: Layout) -> bool:
    """Whether a layer can take ``layout`` at all: the runtime executes it so (``cost_models.capability.predicate``)."""
    if local_problem(node, layout, 4, "float32") is None:
        return node.kind in NO_COMPUTE_KINDS and fits_output(node, layout)
    return True


def fits_output(node: Layer, layout: Layout) -> bool:
    """Whether a layer with no compute of its own (a view) can take ``layout``: every part of its output holds
    an element and the runtime executes it so (``cost_models.capability.predicate``)."""
    return layer_refusal(node, layout) is None


def layout_by_rule(graph: LayerGraph, rule: Rule) -> dict[str, Layout]:
    """Per layer the first layout of ``rule(name, position)`` it can take.

    Raises:
        InputError: A layer can take none of its preferences (named, with what was tried).
    """
    chosen: dict[str, Layout] = {}
    for position, name in enumerate(graph.compute_layers()):
        if (source := _cut_from(graph, name)) in chosen:
            chosen[name] = chosen[source]  # an item of several outputs: their layout (piece_layout_refusal)
            continue
        preferences = list(rule(name, position))
        fitting = [layout for layout in preferences if layout_applies(graph.nodes[name], layout)]
        if not fitting:
            raise InputError(f"layer '{name}' ({graph.nodes[name].kind}, output "
                             f"{tuple(graph.nodes[name].output_shape)}) can take none of "
                             f"{[str(layout) for layout in preferences]}; add n1 as the last preference")
        chosen[name] = fitting[0]
    return chosen


def _cut_from(graph: LayerGraph, name: str) -> str | None:
    """The layer with several outputs that ``name`` (a getitem) reads an item of; ``None`` for other layers."""
    if graph.nodes[name].kind != "getitem":
        return None
    sources = list(graph.predecessors(name))
    produced = graph.nodes[sources[0]].output_shape if len(sources) == 1 else None
    return sources[0] if produced and isinstance(produced[0], list) else None


def uniform_plan(graph: LayerGraph, cluster: Cluster, preferences: Sequence[Layout] | Rule,
                 model_spec: str = "") -> Plan:
    """A one-stage plan on all of ``cluster``'s devices in which each layer takes its first applicable preference."""
    rule: Rule = preferences if callable(preferences) else (lambda _name, _position: list(preferences))
    layouts = layout_by_rule(graph, rule)
    return Plan(graph.fingerprint, graph.input_shape, graph.graph["dtype"], cluster,
                {name: LayerAssignment(layout) for name, layout in layouts.items()},
                Pipeline(1, (cluster.devices,)), model_spec=model_spec,
                created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                input_shapes=recorded_shapes(graph.input_shapes))


def staged(plan: Plan, graph: LayerGraph, starts: Sequence[str], schedule: Schedule = "sync", micro_batches: int = 1,
           staleness: Sequence[int] | None = None) -> Plan:
    """``plan`` (one stage of ``G`` devices) cut into pipeline stages of ``G`` devices each.

    Args:
        starts: The first layer of each stage after the first, in the model's order.
        schedule: ``"sync"`` (with ``micro_batches``) or ``"stale"`` (whole batches).
        staleness: Per stage, for ``stale`` (default DSP's ``2(K−1−k)``).

    Raises:
        InputError: An unknown layer in ``starts``, or starts out of order.
    """
    from cost_models.pipeline_cost import dsp_staleness

    order = graph.compute_layers()
    missing = [name for name in starts if name not in order]
    if missing:
        raise InputError(f"stage starts {missing} are not layers of the model; name layers as parplan inspect does")
    positions = [order.index(name) for name in starts]
    if positions != sorted(set(positions)) or (positions and positions[0] == 0):
        raise InputError(f"stage starts {list(starts)} must be distinct layers after the first, in the model's order")
    stages = len(starts) + 1
    stage_of = {name: sum(position >= p for p in positions) for position, name in enumerate(order)}
    devices = plan.pipeline.devices_per_stage[0]
    if schedule == "stale":
        micro_batches, lags = 1, tuple(staleness) if staleness is not None else dsp_staleness(stages)
    else:
        lags = (0,) * stages
    return Plan(plan.fingerprint, plan.input_shape, plan.dtype, replace(plan.cluster, devices=devices * stages),
                {name: LayerAssignment(a.layout, stage_of[name]) for name, a in plan.layers.items()},
                Pipeline(stages, (devices,) * stages, schedule, micro_batches, lags), model_spec=plan.model_spec,
                created=plan.created, input_shapes=plan.input_shapes)


def default_micro_batches(plan: Plan, graph: LayerGraph, stages: int) -> int:
    """The micro-batches a sync pipeline of ``stages`` takes by default (``parplan run --stages K``): the most that
    divide the batch, at most ``4·K``, whose micro-batches still give every batch-norm of ``plan`` more than one
    value per channel on each of its sample parts (PyTorch refuses one in training); 1 when none does."""
    batch = graph.input_shape[0]
    least = 1  # the fewest samples a micro-batch may hold
    for name, assignment in plan.layers.items():
        layer = graph.nodes[name]
        if layer.kind == "batchnorm" and layer.attrs.get("training") is not False and layer.input_shapes:
            positions = 1
            for extent in layer.input_shapes[0][2:]:
                positions *= extent
            least = max(least, assignment.layout.n * (1 if positions > 1 else 2))
    least = min(least, batch)
    fits = [m for m in range(1, min(batch, 4 * stages) + 1) if batch % m == 0 and batch // m >= least]
    return max(fits, default=1)


def cut_places(graph: LayerGraph) -> list[int]:
    """The positions in ``graph.compute_layers()`` where a pipeline stage may start (the planner's rule,
    ``cost_models.capability.predicate.uncuttable_after``): a model cuts into at most ``len(cut_places) + 1``."""
    forbidden = uncuttable_after(graph)
    return [position for position in range(1, len(graph.compute_layers())) if position - 1 not in forbidden]


def balanced_starts(graph: LayerGraph, stages: int) -> list[str]:
    """The first layer of stages ``1 … K−1`` cutting the model into ``K`` parts of about equal forward+backward FLOPs,
    only where a pipeline can be cut (``cost_models.capability.predicate.uncuttable_after``: the planner's rule).

    Raises:
        InputError: Fewer places to cut than ``K − 1``.
    """
    order = graph.compute_layers()
    allowed = cut_places(graph)
    if not 1 <= stages <= len(allowed) + 1:
        forbidden = len(allowed) < len(order) - 1
        held = f" (of {len(order) - 1} between its {len(order)} layers; the others would send a tuple of tensors, " \
               f"a value no layer holds or one module's parameters to two stages)" if forbidden else ""
        raise InputError(f"cannot cut this model into {stages} stages: it can be cut at {len(allowed)} places"
                         f"{held}; use 1 to {len(allowed) + 1} stages")
    work = [float(graph.nodes[name].flops_fwd) + float(graph.nodes[name].flops_bwd) for name in order]
    before = [0.0, *accumulate(work)]  # the work ahead of each position
    total, starts = before[-1] or 1.0, list[int]()
    for index, position in enumerate(allowed):
        needed = stages - 1 - len(starts)
        if needed and (before[position] >= total * (len(starts) + 1) / stages or len(allowed) - index == needed):
            starts.append(position)
    return [order[position] for position in starts]
