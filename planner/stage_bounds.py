"""Lower bounds on a pipeline configuration's iteration seconds, summed lazily (``planner.stages``).

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
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING, Mapping, Sequence

from cost_models.errors import InputError
from cost_models.layer_cost import least_device_s
from cost_models.profile import Profile
from planner.space import LayerCosts

if TYPE_CHECKING:
    from cost_models.graph import LayerGraph

__all__ = ["Floor", "heaviest_first", "least_work_s"]


class Floor:
    """A lower bound on one configuration's iteration seconds (the module's), summed lazily, heaviest decisions
    first: summing stops where a part of it already reaches what the caller must beat, so a configuration that
    cannot win costs the layouts of a few decisions, not all. Not :attr:`valid` once a decision has no layout at
    all."""

    def __init__(self, costs: Sequence[LayerCosts], order: Sequence[str], *, schedule: str, stages: int,
                 micro_batches: int, devices: int, work_s: float = 0.0) -> None:
        """``devices``: the budget ``B``; ``work_s``: ``V`` (the module's)."""
        self.costs, self.order = costs, order  # one per device count a stage may take
        self.schedule, self.stages, self.micro_batches, self.devices = schedule, stages, micro_batches, devices
        self.work_s = work_s
        self.summed, self.partial_s, self.device_s = 0, 0.0, 0.0
        self.valid = True

    @property
    def bound_s(self) -> float:
        """The bound from the decisions summed so far."""
        busiest_s = max(self.partial_s / self.stages, max(self.device_s, self.work_s) / self.devices)
        if self.schedule == "stale":
            return busiest_s
        return self.partial_s + (self.micro_batches - 1) * busiest_s

    def reaches(self, limit_s: float | None, most: int | None = None) -> bool:
        """Sum decisions (at most ``most`` more) until the bound reaches ``limit_s`` (``None``: all); whether it
        did. A configuration found without layouts reaches every limit."""
        stop = len(self.order) if most is None else min(len(self.order), self.summed + most)
        while self.valid and self.summed < stop and (limit_s is None or self.bound_s < limit_s):
            head = self.order[self.summed]
            try:
                cheapest = [(min(row[2] for row in costs.rows(costs.groups[head])), costs.devices)
                            for costs in self.costs]
            except InputError:  # some layer has no layout on the stage's devices with this micro-batch
                self.valid = False
            else:
                self.partial_s += min(seconds for seconds, _ in cheapest)
                self.device_s += min(seconds * size for seconds, size in cheapest)
            self.summed += 1
        return not self.valid or (limit_s is not None and self.bound_s >= limit_s)


def least_work_s(graph: LayerGraph, profile: Profile, *, recompute: bool) -> float:
    """``V`` (the module's): the least device-seconds of every layer's compute, forward recomputed or not."""
    dtype = graph.graph["dtype"]
    return sum(least_device_s(data, profile, dtype, recompute=recompute) for _, data in graph.nodes(data=True))


def heaviest_first(graph: LayerGraph, groups: Mapping[str, tuple[str, ...]]) -> list[str]:
    """The decisions by the elements their layers write, most first (a guess at their cost, to sum the bound in)."""
    def written(head: str) -> int:
        total = 0
        for layer in groups[head]:
            shape = graph.nodes[layer]["output_shape"]
            total += prod(shape) if shape and not isinstance(shape[0], list) else 0
        return total
    position = {head: index for index, head in enumerate(groups)}
    return sorted(groups, key=lambda head: (-written(head), position[head]))
