"""Tier 1: pipeline formulas against a tiny discrete-event simulation of the same schedules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.pipeline_cost import (
    dsp_staleness,
    least_staleness,
    stale_iteration_s,
    staleness_reason,
    sync_iteration_s,
)

times = st.floats(0.01, 5.0)


def simulate_flow_line(servers: list[float], jobs: int) -> float:
    """Jobs 0..M-1 visit servers in order; a server takes one job at a time, in job order."""
    free = [0.0] * len(servers)
    finish = 0.0
    for _ in range(jobs):
        ready = 0.0
        for index, seconds in enumerate(servers):
            start = max(ready, free[index])
            free[index] = ready = start + seconds
        finish = ready
    return finish


def simulate_gpipe(forward: list[float], backward: list[float], transfer: list[float], micro: int,
                   allreduce: list[float]) -> float:
    line_fwd, line_bwd = [], []
    for k in range(len(forward)):
        line_fwd.append(forward[k])
        line_bwd.append(backward[k])
        if k < len(transfer):
            line_fwd.append(transfer[k])
            line_bwd.append(transfer[k])
    return (simulate_flow_line(line_fwd, micro) + simulate_flow_line(list(reversed(line_bwd)), micro)
            + max(allreduce, default=0.0))


def simulate_dsp(forward: list[float], backward: list[float], transfer: list[float], batches: int,
                 staleness: tuple[int, ...] | None = None) -> float:
    """DSP in steady state: stage k runs F(t), then recompute+B(t − s_k) once its gradient has arrived
    (``s_k`` = ``staleness[k]``, by default DSP's 2(K−1−k); non-increasing).

    Every stage executes its own task list in order; F(b) needs stage k−1's F(b) plus the transfer, B(b) needs
    stage k+1's B(b) plus the transfer (the last stage's needs its own F(b)). Links are full duplex: one
    resource per direction. Returns seconds per batch in the middle of the run.
    """
    stages = len(forward)
    lags = staleness if staleness is not None else dsp_staleness(stages)
    fwd_done = [[0.0] * batches for _ in range(stages)]
    bwd_done = [[0.0] * batches for _ in range(stages)]
    link_fwd, link_bwd = [0.0] * stages, [0.0] * stages
    free = [0.0] * stages
    # Process in a global order that respects every dependency: wave t runs F(t) down the stages,
    # then each stage's B(t − s_k) from the last stage up (it keeps s_k inputs stashed).
    for t in range(batches + max(lags) + 1):
        for k in range(stages):
            if t < batches:
                ready = 0.0
                if k > 0:
                    link_fwd[k - 1] = max(link_fwd[k - 1], fwd_done[k - 1][t]) + transfer[k - 1]
                    ready = link_fwd[k - 1]
                free[k] = fwd_done[k][t] = max(free[k], ready) + forward[k]
        for k in reversed(range(stages)):
            b = t - lags[k]
            if 0 <= b < batches:
                if k == stages - 1:
                    ready = fwd_done[k][b]
                else:
                    link_bwd[k] = max(link_bwd[k], bwd_done[k + 1][b]) + transfer[k]
                    ready = link_bwd[k]
                free[k] = bwd_done[k][b] = max(free[k], ready) + forward[k] + backward[k]
    first, last = batches // 4, 3 * batches // 4  # away from the fill and from the drain
    return (bwd_done[0][last] - bwd_done[0][first]) / (last - first)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(times, times), min_size=1, max_size=5), st.integers(1, 12), st.data())
def test_sync_matches_the_simulation(stages: list[tuple[float, float]], micro: int, data: st.DataObject) -> None:
    forward, backward = [f for f, _ in stages], [b for _, b in stages]
    transfer = data.draw(st.lists(times, min_size=len(stages) - 1, max_size=len(stages) - 1))
    allreduce = data.draw(st.lists(times, min_size=len(stages), max_size=len(stages)))
    assert sync_iteration_s(forward, backward, transfer, micro, allreduce) == pytest.approx(
        simulate_gpipe(forward, backward, transfer, micro, allreduce))


def test_balanced_sync_is_m_plus_k_minus_one_stage_times() -> None:
    assert sync_iteration_s([1.0] * 4, [2.0] * 4, [0.0] * 3, 8) == pytest.approx((8 + 4 - 1) * 3.0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(times, times), min_size=1, max_size=4), st.data())
def test_stale_matches_the_steady_state_of_the_simulation(stages: list[tuple[float, float]], data: st.DataObject) -> None:
    forward, backward = [f for f, _ in stages], [b for _, b in stages]
    transfer = data.draw(st.lists(st.floats(0.0, 0.5), min_size=len(stages) - 1, max_size=len(stages) - 1))
    predicted = stale_iteration_s(forward, backward, transfer)
    simulated = simulate_dsp(forward, backward, transfer, batches=60)
    assert simulated == pytest.approx(predicted, rel=0.02)


def test_stale_beats_sync_and_staleness_is_dsps() -> None:
    forward, backward = [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]
    assert stale_iteration_s(forward, backward, [0.1, 0.1]) < sync_iteration_s(forward, backward, [0.1, 0.1], 1)
    assert dsp_staleness(3) == (4, 2, 0)
    assert dsp_staleness(4, bound=3) == (3, 3, 2, 0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(times, times), min_size=2, max_size=4), st.data())
def test_least_staleness_keeps_the_pace_and_one_less_does_not(stages: list[tuple[float, float]],
                                                               data: st.DataObject) -> None:
    """With the least staleness the simulated pipeline runs at its busiest server's pace; one less on any stage
    (still non-increasing) makes a window bind: slower, in the formula and in the simulation."""
    forward, backward = [f for f, _ in stages], [b for _, b in stages]
    transfer = data.draw(st.lists(st.floats(0.0, 0.5), min_size=len(stages) - 1, max_size=len(stages) - 1))
    lags = least_staleness(forward, backward, transfer)
    pace = max([*transfer, *(2 * f + b for f, b in stages)])
    assert lags[-1] == 0 and list(lags) == sorted(lags, reverse=True)
    assert stale_iteration_s(forward, backward, transfer, staleness=lags) == pytest.approx(pace)
    assert simulate_dsp(forward, backward, transfer, 60, lags) == pytest.approx(pace, rel=0.02)
    for k in range(len(stages) - 1):
        if lags[k] > lags[k + 1]:
            fewer = (*lags[:k], lags[k] - 1, *lags[k + 1:])
            slower = stale_iteration_s(forward, backward, transfer, staleness=fewer)
            assert slower > pace * (1 + 1e-9)
            assert simulate_dsp(forward, backward, transfer, 60, fewer) == pytest.approx(slower, rel=0.02)


def test_least_staleness_of_equal_and_unequal_stages() -> None:
    """Equal stages without transfers need K−1−k (DSP's 2(K−1−k) covers transfers as long as a stage); a
    heavy first stage needs 1 where DSP stashes 4; the bound caps every stage."""
    assert least_staleness([1.0] * 3, [2.0] * 3, [0.0, 0.0]) == (2, 1, 0)
    assert least_staleness([1.0] * 3, [2.0] * 3, [0.1, 0.1]) == (4, 2, 0)
    assert least_staleness([3.0, 1.0, 1.0], [6.0, 2.0, 2.0], [0.0, 0.0]) == (1, 0, 0)
    assert least_staleness([1.0] * 4, [2.0] * 4, [0.1] * 3, bound=3) == (3, 3, 2, 0)


def test_the_staleness_reason_names_the_pace_or_the_binding_window() -> None:
    """Least staleness: the busiest server and its pace, against DSP's; capped below it: the round trip whose
    window binds, and the slower pace it gives (the stale iteration's)."""
    forward, backward, transfer = [3.0, 1.0, 1.0], [6.0, 2.0, 2.0], [0.0, 0.0]
    assert staleness_reason(forward, backward, transfer, [], least_staleness(forward, backward, transfer)) == (
        "staleness 1,0,0: the least per stage at which every gradient returns in time for the pace of stage 0, "
        "1.2e+04 ms a batch (DSP's 2(K−1−k): 4,2,0)")
    equal = [1.0] * 3, [2.0] * 3, [0.1, 0.1]
    capped = (1, 1, 0)
    slower = stale_iteration_s(*equal, staleness=capped)
    why = staleness_reason(*equal, [], capped)
    assert why.startswith("staleness 1,1,0 (capped): the gradient round trip of stages 0–1 (8.2e+03 ms over 1 batch)")
    assert f"{slower * 1e3:.3g} ms a batch instead of stage 0's 4e+03 ms" in why
