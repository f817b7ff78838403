r"""Exact layout choice on graphs of tree-width two by min-sum variable elimination (no memory limit).

The objective ``Σ_l c_{l,x_l} + Σ_{(u,v)} d_{uv}[x_u, x_v]`` is a pairwise
min-sum problem. Eliminating a layer ``x`` whose neighbours are ``y`` (and
``z``) replaces it by a new term on them:

.. code-block:: text

    one neighbour:   f(y)    = min_x  c_x + d_xy[x, y]
    two neighbours:  g(y, z) = min_x  c_x + d_xy[x, y] + d_xz[x, z]     (added to d_yz)

which is the seed paper's shortest path generalised from chains to
series-parallel graphs such as residual networks (a block's input, its
branch and the add form a triangle). Layers are eliminated fewest
neighbours first; when every remaining layer has three or more neighbours
the graph is not of tree-width two and :func:`solve_elimination` refuses
(the ILP takes over). Each step costs ``O(S³)`` for ``S`` options, done with
numpy broadcasting; back-substitution in reverse order recovers the choice.
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from planner.solvers.cost_table import CostTable, Solution

__all__ = ["solve_elimination"]

_Step = tuple[str, tuple[str, ...], np.ndarray]
"""One elimination: the layer, its neighbours then, and its best option per combination of their options."""


def solve_elimination(table: CostTable) -> Solution:
    """The cheapest option per layer, ignoring the memory limit.

    Raises:
        ValueError: The graph has tree-width above two.
    """
    started = time.perf_counter()
    unary = {layer: np.asarray(table.node_s[layer], dtype=np.float64) for layer in table.layers}
    pairs: dict[tuple[str, str], np.ndarray] = {}
    adjacent: dict[str, set[str]] = {layer: set() for layer in table.layers}
    for (u, v), matrix in table.edge_s.items():
        _add_pair(pairs, adjacent, u, v, np.asarray(matrix, dtype=np.float64))
    order = _EliminationOrder(table.layers, adjacent)
    steps: list[_Step] = []
    constant = 0.0
    while unary:
        layer = order.pop()
        neighbours = sorted(adjacent[layer])
        if len(neighbours) > 2:
            raise ValueError(f"tree-width above two at layer {layer!r} ({len(neighbours)} neighbours); use the ILP")
        costs = unary.pop(layer)
        terms = [_pop_pair(pairs, adjacent, layer, other) for other in neighbours]  # each oriented [layer, other]
        constant += _eliminate(unary, pairs, adjacent, layer, costs, neighbours, terms, steps)
        order.update(neighbours)
    choice = _back_substitute(steps)
    return Solution(choice, table.objective(choice), "elimination", "Optimal", time.perf_counter() - started)


class _EliminationOrder:
    """The layers left, fewest neighbours first (ties: the earliest in ``layers``), as a heap with stale entries."""

    def __init__(self, layers: tuple[str, ...], adjacent: dict[str, set[str]]) -> None:
        self.adjacent, self.position = adjacent, {layer: index for index, layer in enumerate(layers)}
        self.heap = [(len(adjacent[layer]), index, layer) for index, layer in enumerate(layers)]
        heapq.heapify(self.heap)
        self.done: set[str] = set()

    def pop(self) -> str:
        """The next layer to eliminate (its entry must be current: its neighbour count as it is now)."""
        while True:
            degree, _, layer = heapq.heappop(self.heap)
            if layer not in self.done and degree == len(self.adjacent[layer]):
                self.done.add(layer)
                return layer

    def update(self, layers: list[str]) -> None:
        """Re-enter ``layers``, whose neighbour counts may have changed."""
        for layer in layers:
            heapq.heappush(self.heap, (len(self.adjacent[layer]), self.position[layer], layer))


def _eliminate(unary: dict[str, np.ndarray], pairs: dict[tuple[str, str], np.ndarray], adjacent: dict[str, set[str]],
               layer: str, costs: np.ndarray, neighbours: list[str], terms: list[np.ndarray],
               steps: list[_Step]) -> float:
    if not neighbours:
        best = int(np.argmin(costs))
        steps.append((layer, (), np.asarray(best)))
        return float(costs[best])
    if len(neighbours) == 1:
        total = costs[:, None] + terms[0]
        steps.append((layer, tuple(neighbours), np.argmin(total, axis=0)))
        unary[neighbours[0]] = unary[neighbours[0]] + total.min(axis=0)
        return 0.0
    total = costs[:, None, None] + terms[0][:, :, None] + terms[1][:, None, :]
    steps.append((layer, tuple(neighbours), np.argmin(total, axis=0)))
    _add_pair(pairs, adjacent, neighbours[0], neighbours[1], total.min(axis=0))
    return 0.0


def _back_substitute(steps: list[_Step]) -> dict[str, int]:
    choice: dict[str, int] = {}
    for layer, neighbours, argmin in reversed(steps):
        index = tuple(choice[other] for other in neighbours)
        choice[layer] = int(argmin[index]) if index else int(argmin)
    return choice


def _add_pair(pairs: dict[tuple[str, str], np.ndarray], adjacent: dict[str, set[str]], u: str, v: str,
              matrix: np.ndarray) -> None:
    if (v, u) in pairs:
        u, v, matrix = v, u, matrix.T
    pairs[(u, v)] = pairs[(u, v)] + matrix if (u, v) in pairs else matrix
    adjacent[u].add(v)
    adjacent[v].add(u)


def _pop_pair(pairs: dict[tuple[str, str], np.ndarray], adjacent: dict[str, set[str]], layer: str,
              other: str) -> np.ndarray:
    adjacent[layer].discard(other)
    adjacent[other].discard(layer)
    if (layer, other) in pairs:
        return pairs.pop((layer, other))
    return pairs.pop((other, layer)).T
