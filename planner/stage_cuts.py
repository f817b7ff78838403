r"""Exact contiguous pipeline cuts: dynamic programming over cut points (PipeDream's and Alpa's formulation).

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection

import numpy as np

__all__ = ["Cuts", "exact_cuts"]

_TAU_CHUNK = 2048  # caps solved at once (memory: stages × points × chunk floats)


@dataclass(frozen=True)
class Cuts:
    """The first decision of each stage, the objective, each stage's time, and the DP rounds it took."""

    starts: tuple[int, ...]
    objective_s: float
    stage_s: tuple[float, ...]
    rounds: int


def exact_cuts(count: int, stages: int, allowed: Collection[int], bound: Callable[[int, int], float],
               true: Callable[[int, int, int], float], *, micro_batches: int = 1, stale: bool = False,
               limit_s: float | None = None) -> Cuts | None:
    """The cuts of ``count`` decisions into ``stages`` stages minimising the objective (module docstring).

    Args:
        allowed: Decisions a stage other than the first may start at.
        bound: ``(i, j) →`` a lower bound on the time of decisions ``[i, j)`` as any stage (``inf``: none fits).
        true: ``(i, j, k) →`` their true time as stage ``k`` (at least the bound; ``inf``: it fits nothing).
        limit_s: Give up (``None``) once a round's optimum — a lower bound on the true one — reaches it: a plan
            already found is at least as fast.

    Returns:
        ``None`` when no cut gives every stage a finite time, or none can come under ``limit_s``.
    """
    points = [0, *sorted(p for p in set(allowed) if 0 < p < count), count]
    if len(points) - 1 < stages:
        return None
    known: dict[tuple[int, int, int], float] = {}
    bounds: dict[tuple[int, int], float] = {}

    def time(i: int, j: int, k: int) -> float:
        if (i, j, k) in known:
            return known[i, j, k]
        if (i, j) not in bounds:
            bounds[i, j] = bound(i, j)
        return bounds[i, j]

    rounds = 0
    while True:
        rounds += 1
        found = _solve(points, stages, time, micro_batches, stale)
        if found is None:
            return None
        segments = list(zip(found, [*found[1:], count]))
        if limit_s is not None and _objective(tuple(time(i, j, k) for k, (i, j) in enumerate(segments)),
                                              micro_batches, stale) >= limit_s:
            return None
        fresh = [(i, j, k) for k, (i, j) in enumerate(segments) if (i, j, k) not in known]
        if not fresh:
            times = tuple(known[i, j, k] for k, (i, j) in enumerate(segments))
            return Cuts(tuple(found), _objective(times, micro_batches, stale), times, rounds)
        for i, j, k in fresh:
            known[i, j, k] = true(i, j, k)


def _objective(times: tuple[float, ...], micro: int, stale: bool) -> float:
    return max(times) if stale else sum(times) + (micro - 1) * max(times)


def _solve(points: list[int], stages: int, time: Callable[[int, int, int], float], micro: int,
           stale: bool) -> list[int] | None:
    """The starts of the best cut under the current times, or ``None``."""
    table = _times(points, stages, time)
    lowest = _min_max(table, stages)
    if not np.isfinite(lowest):
        return None
    if stale or micro == 1:  # the pace (then the least Σ at that pace), or Σ alone
        path = _least_sum(table, stages, np.array([lowest if stale else np.inf]))[0]
        return None if path is None else [points[a] for a in path]
    upper = _least_sum(table, stages, np.array([lowest]))[1][0] + (micro - 1) * lowest  # a plan's objective
    least = _least_sum(table, stages, np.array([np.inf]))[1][0]
    finite = table[np.isfinite(table)]
    caps = np.unique(finite[(finite >= lowest) & (finite <= lowest + (upper - least) / (micro - 1) + 1e-15)])
    best: tuple[float, list[int]] | None = None
    for chunk in range(0, len(caps), _TAU_CHUNK):
        taus = caps[chunk:chunk + _TAU_CHUNK]
        starts, sums = _least_sum(table, stages, taus, every=True)
        totals = sums + (micro - 1) * taus
        index = int(np.argmin(totals))
        if np.isfinite(totals[index]) and (best is None or totals[index] < best[0]):
            best = (float(totals[index]), starts[index])
    return None if best is None else [points[a] for a in best[1]]


def _times(points: list[int], stages: int, time: Callable[[int, int, int], float]) -> np.ndarray:
    """``[k, a, b]``: the time of points ``a … b`` as stage ``k`` (``inf`` where ``b ≤ a``)."""
    size = len(points)
    table = np.full((stages, size, size), np.inf)
    for k in range(stages):
        for a in range(size - 1):
            for b in range(a + 1, size):
                table[k, a, b] = time(points[a], points[b], k)
    return table


def _min_max(table: np.ndarray, stages: int) -> float:
    """The least possible largest stage over all cuts."""
    size = table.shape[1]
    best = np.full(size, np.inf)
    best[0] = 0.0
    for k in range(stages):
        best = np.min(np.maximum(best[:, None], table[k]), axis=0)
    return float(best[size - 1])


def _least_sum(table: np.ndarray, stages: int, taus: np.ndarray, every: bool = False
               ) -> tuple[list[list[int]] | list[int] | None, np.ndarray]:
    """Per cap: the least Σ of ``stages`` stages each at most the cap, and the point indices where that cut's
    stages start (of the first cap only unless ``every``; ``None`` where no cut meets the cap)."""
    size, caps = table.shape[1], len(taus)
    sums = np.full((stages + 1, size, caps), np.inf)
    sums[0, 0, :] = 0.0
    previous = np.zeros((stages + 1, size, caps), dtype=np.int64)
    for s in range(1, stages + 1):
        for b in range(1, size):
            times = table[s - 1, :b, b][:, None]  # (a, 1)
            capped = np.where(times <= taus[None, :], times, np.inf)
            candidates = sums[s - 1, :b, :] + capped  # (a, caps)
            previous[s, b] = np.argmin(candidates, axis=0)
            sums[s, b] = candidates[previous[s, b], np.arange(caps)]
    totals = sums[stages, size - 1]
    paths = [_path(previous, stages, size - 1, c) if np.isfinite(totals[c]) else None for c in range(caps)]
    return (paths if every else paths[0]), totals


def _path(previous: np.ndarray, stages: int, end: int, cap: int) -> list[int]:
    starts, b = [], end
    for s in range(stages, 0, -1):
        b = int(previous[s, b, cap])
        starts.append(b)
    return starts[::-1]
