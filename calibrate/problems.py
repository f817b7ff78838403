"""Which local problems to time: every layer under every candidate layout, deduplicated and ranked.

For each device count ``D`` asked for, the candidate layouts of a layer are
all ``Layout(n, c, h, w)`` whose rank count divides ``D`` (the rest of the
devices hold copies), restricted to what the layer supports
(:func:`cost_models.local_problem.local_problem`). Identical problems —
same kind, shapes, hyper-parameters and dtype — are timed once.

Order: problems are ranked by how much iteration time they can stand for
(occurrences × a rough time from FLOPs and bytes), then interleaved across
(kind, pass) groups so a short budget still measures every kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from cost_models.graph import dtype_itemsize
from cost_models.layout import layouts_dividing
from cost_models.local_problem import LocalProblem, local_problem, phases_of

__all__ = ["Measurement", "enumerate_problems", "schedule"]

_ROUGH_FLOPS_PER_S = 2e10  # only ranks problems; never used as a prediction
_ROUGH_BYTES_PER_S = 5e9


@dataclass(frozen=True)
class Measurement:
    """One thing to time: a local problem's pass, with how many layer×layout cases it stands for."""

    problem: LocalProblem
    phase: str
    occurrences: int

    @property
    def flops(self) -> int:
        """FLOPs of this pass."""
        flops = self.problem.flops
        return {"fwd": flops.fwd, "bwd_data": flops.bwd_data, "bwd_weight": flops.bwd_weight, "bwd": flops.bwd}[self.phase]

    @property
    def bytes(self) -> int:
        """Bytes this pass moves."""
        return self.problem.bytes_moved(self.phase)

    @property
    def importance(self) -> float:
        """Occurrences times a rough time: what a wrong guess here would cost."""
        return self.occurrences * (self.flops / _ROUGH_FLOPS_PER_S + self.bytes / _ROUGH_BYTES_PER_S)


def enumerate_problems(graph: Any, device_counts: Iterable[int]) -> list[Measurement]:
    """The deduplicated (problem, pass) pairs of ``graph`` under all candidate layouts.

    Args:
        graph: A :class:`~cost_models.graph.LayerGraph`.
        device_counts: Device counts the planner may use (e.g. 1, 2, 4).
    """
    layouts = sorted({layout for devices in device_counts for layout in layouts_dividing(devices)},
                     key=lambda layout: (layout.ranks, layout.parts()))
    itemsize = dtype_itemsize(graph.graph["dtype"])
    counts: dict[str, int] = {}
    problems: dict[str, LocalProblem] = {}
    for name in graph.compute_layers():
        for layout in layouts:
            problem = local_problem(graph.nodes[name], layout, itemsize, graph.graph["dtype"])
            if problem is not None:
                problems.setdefault(problem.key, problem)
                counts[problem.key] = counts.get(problem.key, 0) + 1
    return [Measurement(problems[key], phase, counts[key]) for key in problems for phase in phases_of(problems[key])]


def schedule(measurements: Sequence[Measurement]) -> list[Measurement]:
    """Most important first, interleaved round-robin across (kind, pass) groups."""
    groups: dict[tuple[str, str], list[Measurement]] = {}
    for item in sorted(measurements, key=lambda m: -m.importance):
        groups.setdefault((item.problem.kind, item.phase), []).append(item)
    ordered: list[Measurement] = []
    queues = sorted(groups.values(), key=lambda q: -q[0].importance)
    while any(queues):
        for queue in queues:
            if queue:
                ordered.append(queue.pop(0))
    return ordered

