"""``estimate(graph, plan, profile)``: the predicted iteration time, per layer and per term, and peak memory.

Per layer (``layer_cost``): compute from the profile, exposed halo exchange,
batch-norm statistics, the input-gradient sum of a filter split, and its
weight-gradient allreduce. Per edge whose two layouts differ
(``comm_cost.redistribution_s``): the redistribution forward and, for the
gradient, backward.

Assumptions:
    * One pipeline stage; plans with more stages are refused with a clear
      message (their schedules are costed by a later module).
    * The input batch is loaded directly in its first layers' layouts: edges
      from the input cost nothing.
    * A convolution or linear layer split by ``c`` reads its input with
      ``c = 1`` (every filter slice needs all input channels); other layers
      read their input in their own layout. A 2-D tensor (after flattening)
      carries only the ``n`` and ``c`` parts of a layout.
    * Weight-gradient allreduces run on their own stream in reverse layer
      order, each starting when its layer's backward is done and the previous
      allreduce has finished; the step ends when both compute and the last
      allreduce are done. With ``overlap=False`` they add up after backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from cost_models.cluster import Cluster
from cost_models.comm_cost import redistribution_s
from cost_models.errors import PlanError
from cost_models.layer_cost import LayerCost, layer_cost
from cost_models.layout import Layout
from cost_models.local_problem import DENSE_KINDS, local_problem
from cost_models.memory import LayerMemory, layer_memory
from cost_models.plan import Plan, check_plan_for_graph
from cost_models.profile import Profile

__all__ = ["Estimate", "LayerEstimate", "estimate"]

_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class LayerEstimate:
    """One layer's layout, cost terms, incoming redistribution and memory."""

    name: str
    kind: str
    layout: Layout
    cost: LayerCost
    redistribution_s: float
    memory: LayerMemory


@dataclass(frozen=True)
class Estimate:
    """The iteration time, its breakdown per term, peak memory per rank, and the per-layer table."""

    iteration_s: float
    breakdown_s: Mapping[str, float]
    memory_bytes_max: int
    memory_bytes: Mapping[str, int]
    layers: tuple[LayerEstimate, ...]

    def sources(self) -> dict[str, int]:
        """How many layers' compute came from measured entries, the fit, both, or needed none."""
        counts: dict[str, int] = {}
        for layer in self.layers:
            counts[layer.cost.compute_source] = counts.get(layer.cost.compute_source, 0) + 1
        return counts


def estimate(graph: Any, plan: Plan, profile: Profile, cluster: Cluster | None = None, optimizer: str = "sgd",
             overlap: bool = True) -> Estimate:
    """Predict one training iteration of ``plan`` for the traced ``graph``.

    Raises:
        PlanError: The plan does not fit the graph, has several stages, or a
            layout cannot split its layer.
    """
    cluster = cluster or plan.cluster
    if plan.pipeline.stages != 1:
        raise PlanError(f"the plan has {plan.pipeline.stages} pipeline stages; this estimate covers one-stage plans")
    if plan.fingerprint != graph.fingerprint:
        raise PlanError(f"plan was made for model fingerprint {plan.fingerprint}, this model traces to "
                        f"{graph.fingerprint}; make a new plan for this model and input shape")
    check_plan_for_graph(plan, graph)
    dtype = graph.graph["dtype"]
    itemsize = _ITEMSIZE.get(dtype, 4)
    devices = plan.pipeline.devices_per_stage[0]
    layers = tuple(_layer_estimate(graph, plan, name, devices, profile, cluster, itemsize, dtype, optimizer, overlap)
                   for name in graph.compute_layers())
    return _combine(layers, overlap)


def _layer_estimate(graph: Any, plan: Plan, name: str, devices: int, profile: Profile, cluster: Cluster,
                    itemsize: int, dtype: str, optimizer: str, overlap: bool) -> LayerEstimate:
    node, layout = graph.nodes[name], plan.layers[name].layout
    cost = layer_cost(name, node, layout, devices, profile, cluster, itemsize, dtype, overlap)
    moved = sum(_edge_s(graph, plan, source, name, devices, profile, cluster, itemsize)
                for source in graph.predecessors(name))
    memory = layer_memory(node, layout, local_problem(node, layout, itemsize, dtype), optimizer, itemsize)
    return LayerEstimate(name, node["kind"], layout, cost, moved, memory)


def _edge_s(graph: Any, plan: Plan, source: str, target: str, devices: int, profile: Profile, cluster: Cluster,
            itemsize: int) -> float:
    if graph.nodes[source]["kind"] == "input":
        return 0.0
    shape = graph.nodes[source]["output_shape"]
    if not shape or isinstance(shape[0], list):
        return 0.0
    have = plan.layers[source].layout
    want = _input_layout(graph.nodes[target]["kind"], plan.layers[target].layout)
    shape4, have, want = _as_4d(shape, have, want)
    if have == want:
        return 0.0
    return (redistribution_s(profile, cluster, shape4, itemsize, have, want, devices)
            + redistribution_s(profile, cluster, shape4, itemsize, want, have, devices))


def _input_layout(kind: str, layout: Layout) -> Layout:
    return Layout(layout.n, 1, layout.h, layout.w) if kind in DENSE_KINDS and layout.c > 1 else layout


def _as_4d(shape: list[int], have: Layout, want: Layout) -> tuple[tuple[int, ...], Layout, Layout]:
    if len(shape) == 4:
        return tuple(shape), have, want
    flat = (shape[0], int(_product(shape[1:])), 1, 1)
    return flat, Layout(have.n, have.c), Layout(want.n, want.c)


def _combine(layers: tuple[LayerEstimate, ...], overlap: bool) -> Estimate:
    forward = sum(layer.cost.forward_s for layer in layers)
    critical = sum(layer.cost.halo_exposed_s + layer.cost.norm_s + layer.cost.channel_reduce_s + layer.redistribution_s
                   for layer in layers)
    clock = forward + critical
    comm_free = clock
    for layer in reversed(layers):
        clock += layer.cost.backward_s
        if layer.cost.allreduce_s:
            comm_free = max(comm_free, clock) + layer.cost.allreduce_s
    allreduce = sum(layer.cost.allreduce_s for layer in layers)
    iteration = max(clock, comm_free) if overlap else clock + allreduce
    breakdown = {
        "compute_fwd": forward, "compute_bwd": sum(layer.cost.backward_s for layer in layers),
        "halo": sum(layer.cost.halo_s for layer in layers),
        "halo_exposed": sum(layer.cost.halo_exposed_s for layer in layers),
        "norm_stats": sum(layer.cost.norm_s for layer in layers),
        "channel_reduce": sum(layer.cost.channel_reduce_s for layer in layers),
        "redistribution": sum(layer.redistribution_s for layer in layers),
        "allreduce": allreduce, "allreduce_exposed": iteration - clock if overlap else allreduce,
    }
    memory = {term: sum(getattr(layer.memory, term) for layer in layers)
              for term in ("weights", "gradients", "optimizer", "saved")}
    memory["transient"] = max((layer.memory.transient for layer in layers), default=0)
    return Estimate(iteration, breakdown, sum(memory.values()), memory, layers)


def _product(values: list[int]) -> int:
    total = 1
    for value in values:
        total *= value
    return total
