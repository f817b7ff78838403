r"""Safe pruning of layout candidates: drop options no optimal plan can use, from node costs and one known plan.

Both rules look only at per-option node costs and memory, so they run before
the (expensive) edge cost matrices are built, and both are exact: every
optimal choice of the full table survives.

* **Memory**: option ``i`` of layer ``l`` is dropped when
  ``m_{l,i} + Σ_{l'≠l} min_j m_{l',j} > M`` — even with the leanest options
  elsewhere it cannot fit.
* **Bound** (reduced-cost fixing): edge costs are non-negative, so any plan
  that uses option ``i`` at layer ``l`` costs at least
  ``c_{l,i} + Σ_{l'≠l} min_j c_{l',j}``. When that exceeds the objective
  ``U`` of a plan already known to be feasible, no optimal plan uses ``i``.
  The tighter ``U`` (close to the optimum), the more is dropped; the search
  therefore first solves a small restricted table to get a good ``U``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["surviving_options"]

_SLACK = 1e-9  # relative: options within rounding of the bound are kept


def surviving_options(node_s: Mapping[str, Sequence[float]], memory_bytes: Mapping[str, Sequence[int]],
                      memory_limit_bytes: int | None, upper_bound_s: float | None) -> dict[str, list[int]]:
    """Indices of the options per layer that pass both rules (see the module docstring).

    Args:
        node_s: Per layer, the seconds of each option.
        memory_bytes: Per layer, the bytes per rank of each option.
        memory_limit_bytes: ``M``, or ``None`` for no limit.
        upper_bound_s: ``U``, the objective of a known feasible plan, or ``None``.
    """
    least_s = {layer: min(costs) for layer, costs in node_s.items()}
    least_bytes = {layer: min(sizes) for layer, sizes in memory_bytes.items()}
    floor_s, floor_bytes = sum(least_s.values()), sum(least_bytes.values())
    kept = {}
    for layer, costs in node_s.items():
        budget_s = None if upper_bound_s is None else upper_bound_s - floor_s + least_s[layer]
        room = None if memory_limit_bytes is None else memory_limit_bytes - floor_bytes + least_bytes[layer]
        kept[layer] = [i for i, cost in enumerate(costs)
                       if (budget_s is None or cost <= budget_s + _SLACK * max(upper_bound_s or 0.0, 1e-12))
                       and (room is None or memory_bytes[layer][i] <= room)]
    return kept
