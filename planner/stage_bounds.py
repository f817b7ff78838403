"""Lower bounds on a pipeline configuration's iteration seconds, summed lazily (``planner.stages``).

Every stage's forward and backward take at least the sum of its decisions'
cheapest options without the allreduce, so a ``stale`` pipeline of ``K``
stages needs at least that sum over all decisions divided by ``K``, and a
``sync`` one of ``M`` micro-batches ``(K + M − 1)/K`` times the sum for one
micro-batch (``Σ_k t_k + (M − 1)·max_k t_k`` with ``max_k t_k ≥ Σ_k t_k / K``).
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING, Mapping, Sequence

from cost_models.errors import InputError
from planner.space import LayerCosts

if TYPE_CHECKING:
    from cost_models.graph import LayerGraph

__all__ = ["Floor", "bound_scale", "heaviest_first"]


class Floor:
    """A lower bound on one configuration's iteration seconds, summed lazily, heaviest decisions first.

    ``scale`` times the sum of the decisions' cheapest options without the allreduce (the module's bound):
    summing stops where a part of it already reaches what the caller must beat, so a configuration that cannot
    win costs the layouts of a few decisions, not all. Not :attr:`valid` once a decision has no layout at all.
    """

    def __init__(self, costs: Sequence[LayerCosts], order: Sequence[str], scale: float) -> None:
        self.costs, self.order, self.scale = costs, order, scale  # one per device count a stage may take
        self.summed, self.partial_s = 0, 0.0
        self.valid = True

    @property
    def bound_s(self) -> float:
        """The bound from the decisions summed so far."""
        return self.partial_s * self.scale

    def reaches(self, limit_s: float | None, most: int | None = None) -> bool:
        """Sum decisions (at most ``most`` more) until the bound reaches ``limit_s`` (``None``: all); whether it
        did. A configuration found without layouts reaches every limit."""
        stop = len(self.order) if most is None else min(len(self.order), self.summed + most)
        while self.valid and self.summed < stop and (limit_s is None or self.bound_s < limit_s):
            head = self.order[self.summed]
            try:
                self.partial_s += min(row[2] for costs in self.costs for row in costs.rows(costs.groups[head]))
            except InputError:  # some layer has no layout on the stage's devices with this micro-batch
                self.valid = False
            self.summed += 1
        return not self.valid or (limit_s is not None and self.bound_s >= limit_s)


def bound_scale(schedule: str, stages: int, micro: int) -> float:
    """What the sum of one (micro-)batch's cheapest options is multiplied by to bound the iteration's seconds:
    the busiest of ``K`` stages (stale), ``Σ_k t_k + (M − 1)·max_k t_k`` with ``max_k t_k ≥ Σ_k t_k / K`` (sync)."""
    return 1 / stages if schedule == "stale" else (stages + micro - 1) / stages


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
