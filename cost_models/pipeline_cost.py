"""Iteration time of pipeline schedules from per-stage times.

Stage ``k`` of ``K`` needs ``F_k`` seconds forward and ``B_k`` backward per
micro-batch (already scaled by any straggler factor); ``T_k`` is the
point-to-point transfer from stage ``k`` to ``k+1`` (activations forward,
their gradients backward, the same size).

* ``sync`` (GPipe: ``M`` micro-batches, fill/drain, one update): the forward
  phase is a deterministic flow line — ``M`` jobs, all ready at time 0, through
  ``2K−1`` servers (stages and the transfers between them) — whose last job
  finishes at ``Σ servers + (M−1)·max server``; the backward phase is the same
  line reversed; then the flush: each stage's weight-gradient allreduce, the
  slowest one exposed. With equal stages of time ``t`` this is the familiar
  ``(M+K−1)·t`` per phase.
* ``stale`` (DSP: no locking, staleness ``2(K−1−k)``): every stage runs
  forward on new batches and, when a gradient arrives, recomputes its forward
  from the stashed input and runs backward. In steady state the pipeline moves
  at the pace of its busiest server: ``max_k(2F_k + B_k + A_k)`` where ``A_k``
  is the part of the stage's gradient allreduce not hidden behind its backward,
  or ``max_k T_k`` if a link is slower (links are full duplex: activations
  and gradients cross at once) — unless a staleness window binds. Stage ``k``
  runs batch ``t``'s forward in the tick where stage ``m > k`` backwards batch
  ``t − s_m``, whose gradient reaches stage ``k`` ``s_k − s_m`` ticks later;
  that round trip ``C_km = Σ_{k≤j≤m} (2F_j + B_j + A_j) + 2·Σ_{k≤j<m} T_j``
  spans ``s_k − s_m + 1`` ticks, so a batch takes at least
  ``max_{k≤m} C_km / (s_k − s_m + 1)`` (``m = k`` is the busiest stage).
  :func:`least_staleness` picks the least ``s`` under which no window binds:
  the pipeline then moves at its busiest server's pace with as few stashed
  inputs (and as little staleness) as that pace allows — DSP's ``2(K−1−k)`` is
  more than equal stages need, and unequal stages need less still on some.

``tests/test_pipeline_cost.py`` checks both against a discrete-event simulation
of the same schedules.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import ceil

from cost_models.errors import InputError

__all__ = ["dsp_staleness", "least_staleness", "stale_iteration_s", "staleness_reason", "sync_iteration_s"]


def sync_iteration_s(forward_s: Sequence[float], backward_s: Sequence[float], transfer_s: Sequence[float],
                     micro_batches: int, allreduce_s: Sequence[float] = ()) -> float:
    """Seconds of one GPipe iteration (see the module docstring)."""
    _check(forward_s, backward_s, transfer_s, micro_batches)
    servers_fwd = _interleave(forward_s, transfer_s)
    servers_bwd = _interleave(backward_s, transfer_s)
    forward = sum(servers_fwd) + (micro_batches - 1) * max(servers_fwd)
    backward = sum(servers_bwd) + (micro_batches - 1) * max(servers_bwd)
    return forward + backward + max(allreduce_s, default=0.0)


def stale_iteration_s(forward_s: Sequence[float], backward_s: Sequence[float], transfer_s: Sequence[float],
                      allreduce_s: Sequence[float] = (), staleness: Sequence[int] | None = None) -> float:
    """Steady-state seconds per batch of the DSP schedule (see the module docstring).

    ``staleness``: per stage (default DSP's ``2(K−1−k)``).
    """
    _check(forward_s, backward_s, transfer_s, 1)
    lags = list(staleness) if staleness is not None else list(dsp_staleness(len(forward_s)))
    round_trips = _round_trips_s(forward_s, backward_s, transfer_s, allreduce_s)
    windows = [trip / max(1, lags[k] - lags[m] + 1) for (k, m), trip in round_trips.items()]
    return max(list(transfer_s) + windows)


def least_staleness(forward_s: Sequence[float], backward_s: Sequence[float], transfer_s: Sequence[float],
                    allreduce_s: Sequence[float] = (), bound: int | None = None) -> tuple[int, ...]:
    """Per stage, the least staleness at which the stale schedule runs at its busiest server's pace.

    From the last stage (0) back: ``s_k = max_{m>k} s_m + ⌈C_km / τ⌉ − 1`` with ``τ`` the pace of the busiest
    stage or link, so every window ``C_km / (s_k − s_m + 1)`` is at most ``τ`` (module docstring); each ``s_k`` is
    the least that any ``s`` without bubbles has (the constraints only tighten as later stages' grow). ``bound``
    caps every stage (then a window may bind: :func:`stale_iteration_s` prices it).
    """
    _check(forward_s, backward_s, transfer_s, 1)
    round_trips = _round_trips_s(forward_s, backward_s, transfer_s, allreduce_s)
    pace_s = max([*transfer_s, *(round_trips[k, k] for k in range(len(forward_s)))])
    lags = [0] * len(forward_s)
    for k in reversed(range(len(forward_s) - 1)):
        lags[k] = max(lags[m] + _ticks(round_trips[k, m], pace_s) - 1 for m in range(k + 1, len(forward_s)))
    return tuple(lags if bound is None else (min(lag, bound) for lag in lags))


def staleness_reason(forward_s: Sequence[float], backward_s: Sequence[float], transfer_s: Sequence[float],
                     allreduce_s: Sequence[float], staleness: Sequence[int]) -> str:
    """Why a stale pipeline has ``staleness``, in one line: the pace it keeps (its busiest stage or link) and DSP's
    ``2(K−1−k)`` it stashes less than, or — where a cap held a stage below :func:`least_staleness` — the
    round trip whose window binds and what that costs against the busiest server's pace."""
    _check(forward_s, backward_s, transfer_s, 1)
    trips = _round_trips_s(forward_s, backward_s, transfer_s, allreduce_s)
    servers = [(trips[k, k], f"stage {k}") for k in range(len(forward_s))]
    servers += [(seconds, f"the link {k}→{k + 1}") for k, seconds in enumerate(transfer_s)]
    pace_s, busiest = max(servers, key=lambda server: server[0])
    windows = [(trip / max(1, staleness[k] - staleness[m] + 1), k, m) for (k, m), trip in trips.items() if k < m]
    window_s, k, m = max(windows, default=(0.0, 0, 0))
    lags = ",".join(map(str, staleness))
    dsp = ",".join(map(str, dsp_staleness(len(forward_s))))
    if window_s > pace_s * (1 + 1e-9):
        return (f"staleness {lags} (capped): the gradient round trip of stages {k}–{m} "
                f"({trips[k, m] * 1e3:.3g} ms over {_batches(staleness[k] - staleness[m] + 1)}) sets the pace, "
                f"{window_s * 1e3:.3g} ms a batch instead of {busiest}'s {pace_s * 1e3:.3g} ms")
    return (f"staleness {lags}: the least per stage at which every gradient returns in time for the pace of "
            f"{busiest}, {pace_s * 1e3:.3g} ms a batch (DSP's 2(K−1−k): {dsp})")


def _batches(count: int) -> str:
    return f"{count} batch" if count == 1 else f"{count} batches"


def _round_trips_s(forward_s: Sequence[float], backward_s: Sequence[float], transfer_s: Sequence[float],
                   allreduce_s: Sequence[float]) -> dict[tuple[int, int], float]:
    """``C_km`` for every ``k <= m`` (module docstring)."""
    reduce = list(allreduce_s) or [0.0] * len(forward_s)
    stages = [2 * f + b + max(0.0, a - b) for f, b, a in zip(forward_s, backward_s, reduce)]
    return {(k, m): sum(stages[k:m + 1]) + 2 * sum(transfer_s[k:m])
            for k in range(len(stages)) for m in range(k, len(stages))}


def _ticks(round_trip_s: float, pace_s: float) -> int:
    """Ticks of ``pace_s`` a round trip needs: ``⌈round_trip / pace⌉``, forgiving a rounding error's excess."""
    return max(1, ceil(round_trip_s / pace_s * (1 - 1e-9))) if pace_s > 0 else 1


def dsp_staleness(stages: int, bound: int | None = None) -> tuple[int, ...]:
    """DSP's staleness ``2(K−1−k)`` per stage, capped at ``bound`` when given."""
    return tuple(min(2 * (stages - 1 - k), bound) if bound is not None else 2 * (stages - 1 - k)
                 for k in range(stages))


def _interleave(stage_s: Sequence[float], transfer_s: Sequence[float]) -> list[float]:
    servers: list[float] = []
    for index, seconds in enumerate(stage_s):
        servers.append(seconds)
        if index < len(transfer_s):
            servers.append(transfer_s[index])
    return servers


def _check(forward_s: Sequence[float], backward_s: Sequence[float], transfer_s: Sequence[float], micro: int) -> None:
    if not forward_s or len(forward_s) != len(backward_s) or len(transfer_s) != len(forward_s) - 1:
        raise InputError(f"need K forward and backward times and K−1 transfers, got {len(forward_s)}, "
                         f"{len(backward_s)} and {len(transfer_s)}")
    if micro < 1:
        raise InputError(f"micro_batches must be >= 1, got {micro}")
