"""Exact contiguous pipeline cuts: dynamic programming over cut points (PipeDream's and Alpa's formulation).

Decisions ``0 … n−1`` (in topological order) are cut into ``K`` contiguous
stages, stage ``k`` starting at ``p_k`` (``p_0 = 0``; the others from the
allowed points). Stage ``k``'s time ``t(p_k, p_{k+1}, k)`` is its layouts'
exact optimum on its devices — it depends on ``k`` only through what the
schedule keeps in memory there. With ``M`` micro-batches a ``sync`` pipeline
takes (transfers aside, as Alpa's stage DP also leaves them to the pricing)

.. code-block:: text

    T = Σ_k t_k + (M − 1) · max_k t_k

and a ``stale`` one moves at its busiest stage's pace, ``T = max_k t_k``
(ties: the least ``Σ_k t_k``). For a cap ``τ`` on every stage,

.. code-block:: text

    F_τ(0, 0) = 0
    F_τ(s, j) = min_{i < j} F_τ(s − 1, i) + t(i, j, s − 1)      over t(i, j, s − 1) ≤ τ

is the least ``Σ`` of ``s`` stages covering ``[0, j)``, and
``T* = min_τ F_τ(K, n) + (M − 1)·τ`` over the segments' distinct times
(Alpa, OSDI 2022, §5.2): at the optimum's own largest stage ``τ*`` the DP finds
a ``Σ`` no larger, and every ``F_τ`` is a plan whose largest stage is at most
``τ``. Caps below the least possible largest stage (the min-max DP) or above
``(T_upper − Σ_min)/(M − 1)`` cannot win and are not tried; the rest are
solved together, vectorised over ``τ``.

Lazy exactness: the times may first be lower bounds (the sum of a stage's
decisions' cheapest options: edges, the memory limit and recomputing to meet
it only raise it). The DP is solved, the chosen stages' true times asked for, and it is
solved again until every chosen stage's time is true; then no other cut can
beat it, its bound being no lower than its time. ``tests/test_stage_cuts.py``
checks the result against brute force over every cut.

Where a pipeline may be cut (:func:`allowed_cuts`): the decision indices at which a stage may start. A cut must
respect the model's traced order (what the runtime cuts) and send only what the runtime sends between stages: never
a layer's tuple of tensors (``cost_models.capability.predicate.crosses_as_tuple``), a value no layer holds (the
trace's ``held_together`` spans), or the two calls of one module with parameters
(``cost_models.capability.predicate.shared_modules``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from math import gcd
from typing import TYPE_CHECKING

import numpy as np

from cost_models.capability.predicate import uncuttable_after

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["Cuts", "allowed_cuts", "exact_cuts", "fits_nodes"]


_TAU_CHUNK = 256  # caps solved at once; later chunks may be skipped
_DP_ELEMENTS = 1 << 21  # floats of one step of the vectorised DP (start × end points × device units × caps) at most


@dataclass(frozen=True)
class Cuts:
    """The first decision of each stage, its devices, the objective, each stage's time, and the DP rounds."""

    starts: tuple[int, ...]
    devices: tuple[int, ...]
    objective_s: float
    stage_s: tuple[float, ...]
    rounds: int


@dataclass(frozen=True)
class _Grid:
    """The DP's axes: cut points, and device counts in units of their greatest common divisor."""

    points: list[int]
    sizes: tuple[int, ...]
    widths: tuple[int, ...]  # each size in units
    units: int  # the budget in units
    aligned: tuple[np.ndarray, ...]  # per size: whether a stage of it may start after each number of units used


def exact_cuts(count: int, stages: int, allowed: Collection[int], bound: Callable[[int, int, int], float],
               true: Callable[[int, int, int, int], float], *, sizes: Sequence[int] = (1,), budget: int | None = None,
               micro_batches: int = 1, stale: bool = False, limit_s: float | None = None,
               node: int | None = None) -> Cuts | None:
    """The cuts of ``count`` decisions into ``stages`` stages, and each stage's devices, minimising the objective
    (module docstring).

    Args:
        allowed: Decisions a stage other than the first may start at.
        bound: ``(i, j, size) →`` a lower bound on the time of decisions ``[i, j)`` as any stage on ``size``
            devices (``inf``: none fits).
        true: ``(i, j, k, size) →`` their true time as stage ``k`` on ``size`` devices (at least the bound).
        sizes: The device counts a stage may take.
        budget: The devices of all stages together, at most (default: every stage the largest size).
        limit_s: Give up (``None``) once a round's optimum — a lower bound on the true one — reaches it: a plan
            already found is at least as fast.
        node: Devices per node: stages take consecutive devices in order, and each must be whole nodes
            starting at a node's first device, or part of one node (:func:`fits_nodes`); ``None``: any.

    Returns:
        ``None`` when no cut gives every stage a finite time, or none can come under ``limit_s``.
    """
    points = [0, *sorted(p for p in set(allowed) if 0 < p < count), count]
    if len(points) - 1 < stages:
        return None
    unit = reduce(gcd, sizes)
    total = budget if budget is not None else stages * max(sizes)
    aligned = tuple(np.array([fits_nodes(used * unit, size, node, total) for used in range(total // unit + 1)])
                    for size in sizes)
    grid = _Grid(points, tuple(sizes), tuple(size // unit for size in sizes), total // unit, aligned)
    known: dict[tuple[int, int, int, int], float] = {}
    lower = _bounds(grid, bound)

    def time(i: int, j: int, k: int, size: int) -> float:
        return known.get((i, j, k, size), float(lower[grid.points.index(i), grid.points.index(j),
                                                      grid.sizes.index(size)]))

    rounds = 0
    while True:
        rounds += 1
        found = _solve(grid, _times(grid, stages, lower, known), stages, micro_batches, stale, limit_s)
        if found is None:
            return None
        ends = [start for start, _ in found[1:]] + [count]
        segments = [(i, j, k, size) for k, ((i, size), j) in enumerate(zip(found, ends))]
        times = tuple(time(*segment) for segment in segments)
        if limit_s is not None and _objective(times, micro_batches, stale) >= limit_s:
            return None
        fresh = [segment for segment in segments if segment not in known]
        if not fresh:
            return Cuts(tuple(start for start, _ in found), tuple(size for _, size in found),
                        _objective(times, micro_batches, stale), times, rounds)
        for segment in fresh:
            known[segment] = true(*segment)


def fits_nodes(used: int, size: int, node: int | None, budget: int) -> bool:
    """Whether a stage of ``size`` devices may follow ``used`` devices: whole nodes from a node's first device,
    or within one node (any, when every device is on one node or ``node`` is ``None``)."""
    if node is None or budget <= node:
        return True
    if size % node == 0:
        return used % node == 0
    return node % size == 0 and used % node + size <= node


def _objective(times: tuple[float, ...], micro: int, stale: bool) -> float:
    return max(times) if stale else sum(times) + (micro - 1) * max(times)


def _solve(grid: _Grid, table: np.ndarray, stages: int, micro: int, stale: bool,
           limit_s: float | None) -> list[tuple[int, int]] | None:
    """``(start, devices)`` of each stage of the best cut under the current times (``table``), or ``None``."""
    lowest = _min_max(grid, table, stages)
    if not np.isfinite(lowest) or (stale and limit_s is not None and lowest >= limit_s):
        return None
    if stale or micro == 1:  # the pace (then the least Σ at that pace), or Σ alone
        path = _least_sum(grid, table, stages, np.array([lowest if stale else np.inf]))[0][0]
        return None if path is None else _named(grid, path)
    upper = _least_sum(grid, table, stages, np.array([lowest]))[1][0] + (micro - 1) * lowest  # a plan's objective
    least = _least_sum(grid, table, stages, np.array([np.inf]))[1][0]
    if limit_s is not None:
        if least + (micro - 1) * lowest >= limit_s:  # no cut's Σ + (M − 1)·max comes under the limit
            return None
        upper = min(upper, limit_s)
    finite = table[np.isfinite(table)]
    caps = np.unique(finite[(finite >= lowest) & (finite <= lowest + (upper - least) / (micro - 1) + 1e-15)])
    best: tuple[float, list[tuple[int, int]]] | None = None
    for chunk in range(0, len(caps), _TAU_CHUNK):
        taus = caps[chunk:chunk + _TAU_CHUNK]
        if best is not None and least + (micro - 1) * taus[0] >= best[0]:
            break  # every later cap's plans cost more than the best found
        paths, sums = _least_sum(grid, table, stages, taus)
        totals = sums + (micro - 1) * taus
        index = int(np.argmin(totals))
        if np.isfinite(totals[index]) and (best is None or totals[index] < best[0]):
            path = paths[index]
            assert path is not None, "a finite total has a cut"  # (_least_sum: None only where infinite)
            best = (float(totals[index]), path)
    if best is None:  # no cap under the limit: the best plan found (at the least cap) is returned to be priced
        path = _least_sum(grid, table, stages, np.array([lowest]))[0][0]
        return None if path is None else _named(grid, path)
    return _named(grid, best[1])


def _named(grid: _Grid, path: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(grid.points[point], grid.sizes[size]) for point, size in path]


def _bounds(grid: _Grid, bound: Callable[[int, int, int], float]) -> np.ndarray:
    """``[a, b, z]``: the lower bound of points ``a … b`` as a stage on size ``z`` (``inf`` where ``b ≤ a``)."""
    size = len(grid.points)
    table = np.full((size, size, len(grid.sizes)), np.inf)
    for a in range(size - 1):
        for b in range(a + 1, size):
            for z, devices in enumerate(grid.sizes):
                table[a, b, z] = bound(grid.points[a], grid.points[b], devices)
    return table


def _times(grid: _Grid, stages: int, lower: np.ndarray, known: dict[tuple[int, int, int, int], float]) -> np.ndarray:
    """``[k, a, b, z]``: the time of points ``a … b`` as stage ``k`` on size ``z``: true where known, else the
    lower bound."""
    table = np.repeat(lower[None], stages, axis=0)
    index = {point: position for position, point in enumerate(grid.points)}
    for (i, j, k, devices), seconds in known.items():
        table[k, index[i], index[j], grid.sizes.index(devices)] = seconds
    return table


def _min_max(grid: _Grid, table: np.ndarray, stages: int) -> float:
    """The least possible largest stage over all cuts and device splits within the budget."""
    size = table.shape[1]
    best = np.full((size, grid.units + 1), np.inf)  # [point, units used]
    best[0, 0] = 0.0
    for k in range(stages):
        reached = np.full_like(best, np.inf)
        for z, width in enumerate(grid.widths):
            if width > grid.units:
                continue
            before = np.where(grid.aligned[z][None, :grid.units + 1 - width], best[:, :grid.units + 1 - width], np.inf)
            paced = np.maximum(before[:, None, :], table[k, :, :, z][:, :, None])  # [a, b, g]
            reached[:, width:] = np.minimum(reached[:, width:], paced.min(axis=0))
        best = reached
    return float(best[size - 1].min())


def _least_sum(grid: _Grid, table: np.ndarray, stages: int, taus: np.ndarray
               ) -> tuple[list[list[tuple[int, int]] | None], np.ndarray]:
    """Per cap: the least Σ of ``stages`` stages each at most the cap within the device budget, and that cut's
    ``(start point, size index)`` per stage (``None`` where no cut meets the cap). Vectorised over the start
    point, the end point, the devices used and the caps (in pieces of at most ``_DP_ELEMENTS`` elements)."""
    size, units = table.shape[1], grid.units + 1
    piece = max(1, _DP_ELEMENTS // (size * size * units))
    if len(taus) > piece:
        parts = [_least_sum(grid, table, stages, taus[at:at + piece]) for at in range(0, len(taus), piece)]
        return [path for found, _ in parts for path in found], np.concatenate([sums for _, sums in parts])
    caps = len(taus)
    sums = np.full((stages + 1, size, units, caps), np.inf)
    sums[0, 0, 0, :] = 0.0
    came = np.zeros((stages + 1, size, units, caps, 2), dtype=np.int64)  # (a, z) of the stage ending at b
    for s in range(1, stages + 1):
        for z, width in enumerate(grid.widths):
            times = table[s - 1, :, :, z]  # [a, b]
            if width >= units or not np.isfinite(times).any():
                continue
            capped = np.where(times[:, :, None] <= taus, times[:, :, None], np.inf)  # [a, b, cap]
            before = np.where(grid.aligned[z][None, :units - width, None], sums[s - 1][:, :units - width, :], np.inf)
            candidates = before[:, None, :, :] + capped[:, :, None, :]  # [a, b, g, cap]
            a = np.argmin(candidates, axis=0)  # [b, g, cap]
            value = np.take_along_axis(candidates, a[None], axis=0)[0]
            better = value < sums[s, :, width:, :]
            sums[s, :, width:, :] = np.where(better, value, sums[s, :, width:, :])
            came[s, :, width:, :, 0] = np.where(better, a, came[s, :, width:, :, 0])
            came[s, :, width:, :, 1] = np.where(better, z, came[s, :, width:, :, 1])
    ends = sums[stages, size - 1]  # [units, cap]
    used = np.argmin(ends, axis=0)
    totals = ends[used, np.arange(caps)]
    paths = [_path(grid, came, stages, size - 1, int(used[c]), c) if np.isfinite(totals[c]) else None
             for c in range(caps)]
    return paths, totals


def _path(grid: _Grid, came: np.ndarray, stages: int, end: int, used: int, cap: int) -> list[tuple[int, int]]:
    found, b, g = [], end, used
    for s in range(stages, 0, -1):
        a, z = (int(v) for v in came[s, b, g, cap])
        found.append((a, z))
        b, g = a, g - grid.widths[z]
    return found[::-1]


def allowed_cuts(graph: LayerGraph, groups: Mapping[str, tuple[str, ...]]) -> set[int]:
    """Decision indices (into ``groups``, in order) where a stage may start: every layer before precedes every
    layer after in the model's order, and the runtime can send what crosses the cut.

    The runtime cuts the traced program, whose order can differ from the decisions' topological order (a
    residual block's shortcut convolution is traced after the block's main branch).
    """
    position = {layer: index for index, layer in enumerate(graph.compute_layers())}
    spans = [[position[layer] for layer in members] for members in groups.values()]
    before, after = [], []
    largest, smallest = -1, len(position)
    for span in spans:
        largest = max(largest, *span)
        before.append(largest)
    for span in reversed(spans):
        smallest = min(smallest, *span)
        after.append(smallest)
    after.reverse()
    forbidden = uncuttable_after(graph)
    return {i for i in range(1, len(spans)) if before[i - 1] < after[i] and before[i - 1] not in forbidden}


