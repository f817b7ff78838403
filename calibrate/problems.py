"""Which local problems to time: every layer under every candidate layout, deduplicated and counted.

For each device count ``D`` asked for, the candidate layouts of a layer are
all ``Layout(n, c, h, w)`` whose rank count divides ``D`` (the rest of the
devices hold copies), restricted to what the layer supports
(:func:`cost_models.local_problem.local_problem`). Identical problems —
same kind, shapes, hyper-parameters and dtype — are timed once.

Calibration times them in model order (``calibrate.sequences``); this
enumeration counts them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cost_models.layout import layouts_dividing
from cost_models.local_problem import LocalProblem, layer_problem, phases_of

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["Call", "Measurement", "enumerate_problems"]


@dataclass(frozen=True)
class Call:
    """One kernel call: a local problem's pass."""

    problem: LocalProblem
    phase: str

    @property
    def flops(self) -> int:
        """FLOPs of this pass."""
        return self.problem.phase_flops(self.phase)

    @property
    def bytes(self) -> int:
        """Bytes this pass moves."""
        return self.problem.bytes_moved(self.phase)


@dataclass(frozen=True)
class Measurement(Call):
    """One thing to time: a local problem's pass, with how many layer×layout cases it stands for."""

    occurrences: int


def enumerate_problems(graph: LayerGraph, device_counts: Iterable[int]) -> list[Measurement]:
    """The deduplicated (problem, pass) pairs of ``graph`` under all candidate layouts.

    Args:
        graph: A :class:`~cost_models.ir.graph.LayerGraph`.
        device_counts: Device counts the planner may use (e.g. 1, 2, 4).
    """
    layouts = sorted({layout for devices in device_counts for layout in layouts_dividing(devices)},
                     key=lambda layout: (layout.ranks, layout.parts()))
    counts: dict[str, int] = {}
    problems: dict[str, LocalProblem] = {}
    for name in graph.compute_layers():
        for layout in layouts:
            problem = layer_problem(graph.nodes[name], layout, graph.graph["dtype"])
            if problem is not None:
                problems.setdefault(problem.key, problem)
                counts[problem.key] = counts.get(problem.key, 0) + 1
    return [Measurement(problems[key], phase, counts[key]) for key in problems for phase in phases_of(problems[key])]
