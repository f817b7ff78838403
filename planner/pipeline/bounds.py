"""Lower bounds on a pipeline configuration's iteration seconds, summed lazily (``planner.pipeline.stages``).

Stage ``k`` of ``s_k`` devices takes ``t_k`` seconds per (micro-)batch, at least
the sum of its decisions' cheapest options on ``s_k`` devices without the
allreduce, priced as its schedule runs them (a ``stale`` stage recomputes its
forward before its backward: ``2F + B``). With ``c_s(d)`` decision ``d``'s
cheapest option on ``s`` devices (``s`` one of the sizes a stage may take), ``S = Σ_d min_s c_s(d)`` and the
device-seconds ``W = Σ_d min_s s·c_s(d)``:

* ``Σ_k t_k ≥ S``, so ``max_k t_k ≥ S / K``;
* ``Σ_k s_k·t_k ≥ W`` and ``Σ_k s_k ≤ B`` (the configuration's device budget:
  devices may stay idle), so ``max_k t_k ≥ W / B`` — the stronger where stages
  differ in size: a decision's cheapest option is on the largest stage, which
  only some stages are;
* likewise ``Σ_k s_k·t_k ≥ V``, the least device-seconds of the layers' compute
  under any layout on any number of ranks (``cost_models.layer_cost.least_device_s``:
  the ranks of a split compute at least the whole layer's flops), known before
  any layout is priced: a budget too small for the work is skipped unpriced.

A ``stale`` pipeline's iteration takes ``max_k t_k ≥ max(S/K, W/B, V/B)``; a
``sync`` one of ``M`` micro-batches ``Σ_k t_k + (M − 1)·max_k t_k ≥ S + (M − 1)·
max(S/K, W/B, V/B)``.

Until every decision is summed, each one not yet priced counts its own least
device-seconds ``V_d`` (``V = Σ_d V_d``): ``c_s(d) ≥ V_d / s ≥ V_d / s_max`` in
``S`` and ``s·c_s(d) ≥ V_d`` in ``W``, with ``s_max`` the largest size a stage
may take. So before any layout is priced a sync pipeline already needs
``V/s_max + (M − 1)·V/B`` — more than the best plan where its stages are small
against the budget or its micro-batches many — and the bound rises with each
decision summed instead of starting from nothing.

The transfer floor (:func:`send_floor`): a lower bound on the seconds a pipeline stage takes to send its
activations to the next, per cut and stage size. A stale pipeline moves at least at its slowest link's pace
(``cost_models.pipeline_cost``), so the stage search (``planner.pipeline.stages``) skips a stale configuration
whose cuts cannot beat the best plan once each stage counts this floor. The floor is ``cost_models.estimate``'s
transfer with every tensor crossing the cut split over all the stage's devices (a layout uses at most them),
between nodes where the stage fills whole nodes (the next one then starts on another), else over the faster
link.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate
from math import prod
from typing import TYPE_CHECKING

from cost_models.cluster import Cluster
from cost_models.errors import InputError
from cost_models.estimate import crossing_bytes, transfer_s
from cost_models.layer_cost import least_device_s
from cost_models.profile import Profile
from planner.space import LayerCosts

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["Floor", "decision_works_s", "heaviest_first", "send_floor"]


class Floor:
    """A lower bound on one configuration's iteration seconds (the module's), summed lazily, heaviest decisions
    first: summing stops where a part of it already reaches what the caller must beat, so a configuration that
    cannot win costs the layouts of a few decisions, not all. Not :attr:`valid` once a decision has no layout at
    all."""

    def __init__(self, sizes: Sequence[int], costs_of: Callable[[int], LayerCosts], order: Sequence[str], *,
                 schedule: str, stages: int, micro_batches: int, devices: int, works_s: Sequence[float] = ()) -> None:
        """``sizes``: the device counts a stage may take, ``costs_of(size)`` the costs there (made when first
        summed: a configuration skipped unpriced makes none); ``devices``: the budget ``B``; ``works_s``: each
        decision's ``V_d`` in ``order`` (the module's; none: zero)."""
        self.sizes, self.costs_of, self.order = sizes, costs_of, order
        self.schedule, self.stages, self.micro_batches, self.devices = schedule, stages, micro_batches, devices
        self.largest = max(sizes)
        works = list(works_s) or [0.0] * len(order)
        self.rest_after_s = [*accumulate(reversed(works), initial=0.0)][::-1]  # V_d of decisions index … (one pass)
        self.summed, self.partial_s, self.device_s = 0, 0.0, 0.0
        self.valid = True

    @property
    def bound_s(self) -> float:
        """The bound from the decisions summed so far, the rest counted by their least device-seconds."""
        rest_s = self.rest_after_s[self.summed]
        stage_sum_s = self.partial_s + rest_s / self.largest
        busiest_s = max(stage_sum_s / self.stages, (self.device_s + rest_s) / self.devices)
        if self.schedule == "stale":
            return busiest_s
        return stage_sum_s + (self.micro_batches - 1) * busiest_s

    def reaches(self, limit_s: float | None, most: int | None = None) -> bool:
        """Sum decisions (at most ``most`` more) until the bound reaches ``limit_s`` (``None``: all); whether it
        did. A configuration found without layouts reaches every limit."""
        stop = len(self.order) if most is None else min(len(self.order), self.summed + most)
        while self.valid and self.summed < stop and (limit_s is None or self.bound_s < limit_s):
            head = self.order[self.summed]
            try:
                cheapest = [(min(row.hidden_s for row in costs.rows(costs.groups[head])), costs.devices)
                            for costs in map(self.costs_of, self.sizes)]
            except InputError:  # some layer has no layout on the stage's devices with this micro-batch
                self.valid = False
            else:
                self.partial_s += min(seconds for seconds, _ in cheapest)
                self.device_s += min(seconds * size for seconds, size in cheapest)
            self.summed += 1
        return not self.valid or (limit_s is not None and self.bound_s >= limit_s)


def decision_works_s(graph: LayerGraph, profile: Profile, groups: Mapping[str, tuple[str, ...]], order: Sequence[str],
                     *, recompute: bool) -> list[float]:
    """``V_d`` (the module's) of each decision in ``order``: the least device-seconds of its layers' compute,
    forward recomputed or not."""
    dtype = graph.graph["dtype"]
    return [sum(least_device_s(graph.nodes[layer], profile, dtype, recompute=recompute) for layer in groups[head])
            for head in order]


def heaviest_first(graph: LayerGraph, groups: Mapping[str, tuple[str, ...]]) -> list[str]:
    """The decisions by the elements their layers write, most first (a guess at their cost, to sum the bound in)."""
    def written(head: str) -> int:
        total = 0
        for layer in groups[head]:
            shape = graph.nodes[layer].output_shape
            total += prod(shape) if shape and not isinstance(shape[0], list) else 0
        return total
    position = {head: index for index, head in enumerate(groups)}
    return sorted(groups, key=lambda head: (-written(head), position[head]))


def send_floor(graph: LayerGraph, groups: Mapping[str, tuple[str, ...]], heads: Sequence[str], profile: Profile,
               cluster: Cluster, cache: dict[tuple[int, int], list[float]]) -> Callable[[int, int], float]:
    """``(j, size) →`` the floor (module docstring) of a stage ending before decision ``j`` (of ``heads``, in
    order) on ``size`` devices; 0 after the last. ``cache``: the floors of every cut per graph (its ``id``) and
    size, kept across calls."""
    def floor(j: int, size: int) -> float:
        key = (id(graph), size)
        if key not in cache:
            levels = ("inter",) if size >= cluster.devices_per_node else ("intra", "inter")
            cache[key] = [min(transfer_s(profile, level, nbytes) for level in levels)
                          for nbytes in _crossing_bytes(graph, groups, heads, size)]
        return cache[key][j]
    return floor


def _crossing_bytes(graph: LayerGraph, groups: Mapping[str, tuple[str, ...]], heads: Sequence[str],
                    size: int) -> list[int]:
    """Per decision ``j`` (and after the last): the bytes one of ``size`` ranks sends across a cut before ``j``
    (``cost_models.estimate``'s boundary: each edge from a stage to a later one); none after the last."""
    position = {layer: index for index, head in enumerate(heads) for layer in groups[head]}
    change = [0] * (len(heads) + 2)
    dtype = graph.graph["dtype"]
    for source, target in graph.edges:
        if source in position and target in position and position[source] < position[target]:
            nbytes = crossing_bytes(graph.nodes[source], size, dtype)
            change[position[source] + 1] += nbytes  # crossed by the cuts before decisions source+1 … target
            change[position[target] + 1] -= nbytes
    found, running = [], 0
    for j in range(len(heads) + 1):
        running += change[j]
        found.append(running if j < len(heads) else 0)
    return found
