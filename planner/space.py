"""The search space: which layouts each layer may take on a stage's devices, and their cost table.

A layer may take ``Layout(n, c, h, w)`` when ``n·c·h·w`` divides the stage's
devices (the rest hold copies), its kind supports the split and its tensor
has at least one element per part (``cost_models.local_problem``), and, for
windows split by height or width, no tile needs rows beyond its neighbour
(``cost_models.halo``). Layers without compute of their own (views) may take
any layout that fits their output.

The table's costs come from ``cost_models``: per (layer, layout) the layer's
seconds and its resident bytes per rank; per edge and pair of layouts the
redistribution seconds forward and backward. The weight-gradient allreduce
overlaps backward in the full model, which an additive objective cannot say,
so there are two tables that bracket it: ``table`` counts each allreduce in
full, ``hidden_allreduce`` not at all.

No candidate is pruned yet: a safe dominance test must compare edge costs
too, which is left for the planner issue's next step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from cost_models.cluster import Cluster
from cost_models.errors import InputError
from cost_models.estimate import edge_s
from cost_models.graph import dtype_itemsize
from cost_models.layer_cost import LayerCost, layer_cost
from cost_models.layout import Layout, layouts_dividing
from cost_models.local_problem import DENSE_KINDS, local_problem
from cost_models.memory import layer_memory
from cost_models.profile import Profile
from planner.cost_table import CostTable

__all__ = ["Space", "build_space"]

_NO_COMPUTE = frozenset({"flatten", "view", "getitem", "identity"})


@dataclass(frozen=True)
class Space:
    """The candidate layouts per layer and the two cost tables over them."""

    candidates: Mapping[str, tuple[Layout, ...]]
    table: CostTable
    hidden_allreduce: CostTable


def build_space(graph: Any, profile: Profile, cluster: Cluster, devices: int, optimizer: str = "sgd",
                memory_limit_bytes: int | None = None) -> Space:
    """Candidates and the cost table of every compute layer of ``graph`` on ``devices`` devices.

    Raises:
        InputError: A layer has no layout at all on these devices.
    """
    itemsize, dtype = dtype_itemsize(graph.graph["dtype"]), graph.graph["dtype"]
    layers = graph.compute_layers()
    candidates, node_s, hidden_s, memory = {}, {}, {}, {}
    for name in layers:
        options = _feasible(graph.nodes[name], devices, profile, cluster, itemsize, dtype, optimizer)
        if not options:
            raise InputError(f"layer '{name}' has no layout on {devices} devices; try a device count it can split by")
        candidates[name] = tuple(options)
        node_s[name] = tuple(cost.total_s for _, cost, _ in options)
        hidden_s[name] = tuple(cost.total_s - cost.allreduce_s for _, cost, _ in options)
        memory[name] = tuple(nbytes for _, _, nbytes in options)
    edges = [(u, v) for u, v in graph.edges if u in candidates and v in candidates]
    moves = _EdgeCosts(profile, cluster, devices, itemsize)
    edge_table = {(u, v): tuple(tuple(moves(graph.nodes[u], graph.nodes[v], a, b) for b, _, _ in candidates[v])
                                for a, _, _ in candidates[u]) for u, v in edges}
    labels = {name: tuple(str(layout) for layout, _, _ in candidates[name]) for name in layers}
    table = CostTable(tuple(layers), labels, node_s, edge_table, memory, memory_limit_bytes)
    hidden = CostTable(tuple(layers), labels, hidden_s, edge_table, memory, memory_limit_bytes)
    return Space({name: tuple(layout for layout, _, _ in options) for name, options in candidates.items()},
                 table, hidden)


class _EdgeCosts:
    """Redistribution seconds per (tensor shape, reader kind, layouts), computed once: blocks repeat."""

    def __init__(self, profile: Profile, cluster: Cluster, devices: int, itemsize: int) -> None:
        self.profile, self.cluster, self.devices, self.itemsize = profile, cluster, devices, itemsize
        self.seen: dict[tuple[Any, ...], float] = {}

    def __call__(self, source: Mapping[str, Any], target: Mapping[str, Any], have: Layout, layout: Layout) -> float:
        shape = source["output_shape"]
        key = (source["kind"], _frozen(shape), target["kind"] in DENSE_KINDS, have, layout)
        if key not in self.seen:
            self.seen[key] = edge_s(source, target, have, layout, self.devices, self.profile, self.cluster,
                                    self.itemsize)
        return self.seen[key]


def _frozen(shape: Any) -> Any:
    return tuple(_frozen(s) for s in shape) if isinstance(shape, list) else shape


def _feasible(node: Mapping[str, Any], devices: int, profile: Profile, cluster: Cluster, itemsize: int, dtype: str,
              optimizer: str) -> list[tuple[Layout, LayerCost, int]]:
    options = []
    for layout in layouts_dividing(devices):
        problem = local_problem(node, layout, itemsize, dtype)
        if problem is None and not (node["kind"] in _NO_COMPUTE and _fits(node, layout)):
            continue
        try:
            cost = layer_cost("", node, layout, devices, profile, cluster, itemsize, dtype)
        except InputError:  # a halo wider than the neighbouring tile, or a split the kind refuses
            continue
        nbytes = layer_memory(node, layout, problem, optimizer, itemsize).resident_bytes
        options.append((layout, cost, nbytes))
    return options


def _fits(node: Mapping[str, Any], layout: Layout) -> bool:
    shape = node["output_shape"]
    if len(shape) == 4:
        return layout.fits(tuple(shape))
    return layout.h == layout.w == 1 and shape[0] >= layout.n and (len(shape) < 2 or shape[-1] >= layout.c)
