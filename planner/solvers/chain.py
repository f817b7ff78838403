"""Exact layout choice on a chain of layers: the seed paper's shortest path, ``O(L·S²)``.

Nodes are (layer, option) pairs; an arc from ``(l, i)`` to ``(l+1, j)`` weighs
``edge_s[(l, l+1)][i][j] + node_s[l+1][j]``. Dynamic programming over the
layers keeps, per option of the current layer, the cheapest path reaching it.
Memory limits are not expressible in a shortest path; a chain with a memory
limit goes to the ILP.
"""

from __future__ import annotations

import time

from planner.solvers.cost_table import CostTable, Solution

__all__ = ["solve_chain"]


def solve_chain(table: CostTable) -> Solution:
    """The cheapest option per layer of a chain table.

    Raises:
        ValueError: The table is not a chain, or it has a memory limit.
    """
    if not table.is_chain() and len(table.layers) > 1:
        raise ValueError("solve_chain needs a chain: edges exactly layers[i] → layers[i+1]")
    if table.memory_limit_bytes is not None:
        raise ValueError("a memory limit needs the ILP (solve_ilp)")
    started = time.perf_counter()
    first = table.layers[0]
    best = list(table.node_s[first])
    back: list[list[int]] = []
    for previous, layer in zip(table.layers, table.layers[1:]):
        matrix, costs = table.edge_s[(previous, layer)], table.node_s[layer]
        step, pointers = [], []
        for j, cost in enumerate(costs):
            i = min(range(len(best)), key=lambda k: best[k] + matrix[k][j])
            step.append(best[i] + matrix[i][j] + cost)
            pointers.append(i)
        best = step
        back.append(pointers)
    index = min(range(len(best)), key=best.__getitem__)
    objective = best[index]
    choice = {table.layers[-1]: index}
    for layer, pointers in zip(reversed(table.layers[:-1]), reversed(back)):
        index = pointers[index]
        choice[layer] = index
    return Solution(choice, objective, "shortest-path", "Optimal", time.perf_counter() - started)
