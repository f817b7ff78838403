"""Why a layout was chosen: per decision, the runner-up option and how much more the plan would cost with it.

The runner-up of a decision is its best other option with every other
decision kept as chosen; the difference is computed on the cost table the
plan was solved on (node and edge seconds), so it reads as "switching this
layer (and its followers) to X costs Δ more".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from planner.solvers.cost_table import CostTable

__all__ = ["RunnerUp", "runner_ups"]


@dataclass(frozen=True)
class RunnerUp:
    """The best other option of one decision and its extra seconds (``None`` when it had no other option)."""

    option: str | None
    extra_s: float | None


def runner_ups(table: CostTable, choice: Mapping[str, int]) -> dict[str, RunnerUp]:
    """Per decision of ``table``, the runner-up option under ``choice`` (see the module docstring)."""
    touching: dict[str, list[tuple[str, str]]] = {layer: [] for layer in table.layers}
    for u, v in table.edge_s:
        touching[u].append((u, v))
        touching[v].append((u, v))
    found = {}
    for layer in table.layers:
        costs = [_local_s(table, choice, layer, index, touching[layer]) for index in range(len(table.options[layer]))]
        others = [index for index in range(len(costs)) if index != choice[layer]]
        if not others:
            found[layer] = RunnerUp(None, None)
            continue
        best = min(others, key=lambda index: costs[index])
        found[layer] = RunnerUp(table.options[layer][best], costs[best] - costs[choice[layer]])
    return found


def _local_s(table: CostTable, choice: Mapping[str, int], layer: str, index: int,
             edges: list[tuple[str, str]]) -> float:
    total = table.node_s[layer][index]
    for u, v in edges:
        row = index if u == layer else choice[u]
        column = index if v == layer else choice[v]
        total += table.edge_s[(u, v)][row][column]
    return total
