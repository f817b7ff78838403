r"""Every segment's optimum at once: a lower bound on each candidate pipeline stage's time.

For a cost table (``planner.cost_table``; layers in topological order) and
cut points ``p_0 < p_1 < …``, the optimum of layers ``[p_a, p_b)`` alone —
their node costs and the edges among them, edges from earlier layers left
out (those are stage crossings), without the memory limit — is found for
every ``a < b`` with one sweep per start: min-sum variable elimination in
topological order. The sweep keeps a table ``φ`` over the *frontier*, the
layers already added that still have an edge to a later one:

.. code-block:: text

    add layer d:      φ ← φ ⊕ c_d ⊕ Σ_{u ∈ frontier, (u, d) edge} e_ud      (a new axis for d)
    drop layer u:     φ ← min over u's axis, once no edge of u reaches past d
    segment [p_a, d+1): min φ

A residual network keeps two or three layers on the frontier, so ``φ`` has
``S²``–``S³`` entries for ``S`` options. Where it would exceed
``max_entries`` (DenseNet's concatenations keep many layers live) the sweep
stops refining: the rest of that start's segments get ``min φ`` so far plus
each further layer's cheapest option — still a lower bound, as no edge costs
less than nothing. Memory can only raise a stage's time (the limit removes
options; recomputing to meet it adds the forward), so these are lower bounds
on the true stage times for :func:`planner.stage_cuts.exact_cuts`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from planner.cost_table import CostTable

__all__ = ["segment_optima"]


def segment_optima(table: CostTable, points: Sequence[int], *,
                   max_entries: int = 1 << 22) -> dict[tuple[int, int], float]:
    """``(p_a, p_b) → `` the optimum of layers ``[p_a, p_b)`` of ``table`` alone (module docstring).

    ``points`` are layer indices in ``0 … len(table.layers)``, sorted; every pair ``a < b`` is answered.
    """
    sweep = _Sweep(table, max_entries)
    found: dict[tuple[int, int], float] = {}
    for a, start in enumerate(points[:-1]):
        found.update(sweep.from_start(start, set(points[a + 1:])))
    return found


class _Sweep:
    """The table as arrays, and the sweeps from each start."""

    def __init__(self, table: CostTable, max_entries: int) -> None:
        self.layers = table.layers
        index = {layer: i for i, layer in enumerate(self.layers)}
        self.nodes = [np.asarray(table.node_s[layer], dtype=np.float64) for layer in self.layers]
        self.into: list[list[tuple[int, np.ndarray]]] = [[] for _ in self.layers]
        self.last = list(range(len(self.layers)))  # the last layer each one has an edge to (itself: none)
        for (u, v), matrix in table.edge_s.items():
            self.into[index[v]].append((index[u], np.asarray(matrix, dtype=np.float64)))
            self.last[index[u]] = max(self.last[index[u]], index[v])
        self.cheapest = [float(costs.min()) for costs in self.nodes]
        self.max_entries = max_entries

    def from_start(self, start: int, ends: set[int]) -> dict[tuple[int, int], float]:
        phi, frontier = np.zeros(()), []
        found, floor = {}, None  # floor: the bound so far once φ grew too large
        for d in range(start, max(ends)):
            if floor is None:
                phi, frontier = self._add(phi, frontier, d)
                if phi.size > self.max_entries:
                    floor = float(phi.min())
            else:
                floor += self.cheapest[d]
            if d + 1 in ends:
                found[start, d + 1] = float(phi.min()) if floor is None else floor
        return found

    def _add(self, phi: np.ndarray, frontier: list[int], d: int) -> tuple[np.ndarray, list[int]]:
        axes = len(frontier)
        phi = phi[..., None] + self.nodes[d].reshape((1,) * axes + (-1,))
        position = {layer: axis for axis, layer in enumerate(frontier)}
        for u, matrix in self.into[d]:
            if u in position:  # an edge from before the start is a crossing, not this segment's
                shape = [1] * (axes + 1)
                shape[position[u]], shape[-1] = matrix.shape
                phi = phi + matrix.reshape(shape)
        frontier = [*frontier, d]
        done = [axis for axis, layer in enumerate(frontier) if self.last[layer] <= d]
        if done:
            phi = phi.min(axis=tuple(done))
            frontier = [layer for axis, layer in enumerate(frontier) if axis not in done]
        return phi, frontier
