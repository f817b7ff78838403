"""Tier 1: the stage-cut DP (planner.stage_cuts) against brute force over every cut, with lazy true times."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.stage_cuts import exact_cuts


def _brute(count, stages, allowed, true, micro, stale):  # noqa: ANN001, ANN202
    best = math.inf
    for starts in itertools.combinations(sorted(p for p in set(allowed) if 0 < p < count), stages - 1):
        cuts = [0, *starts, count]
        times = [true(cuts[k], cuts[k + 1], k) for k in range(stages)]
        if all(math.isfinite(t) for t in times):
            best = min(best, max(times) if stale else sum(times) + (micro - 1) * max(times))
    return best


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 9), st.integers(1, 4), st.integers(1, 6), st.booleans(), st.data())
def test_the_dp_finds_what_brute_force_finds(count: int, stages: int, micro: int, stale: bool,
                                            data: st.DataObject) -> None:
    """Random per-decision times, a per-stage memory penalty (true ≥ bound) and some infeasible segments."""
    weights = data.draw(st.lists(st.floats(0.1, 5.0), min_size=count, max_size=count))
    allowed = data.draw(st.sets(st.integers(1, count - 1))) if count > 1 else set()
    penalty = data.draw(st.floats(0.0, 3.0))
    blocked = data.draw(st.sets(st.tuples(st.integers(0, count), st.integers(0, count)), max_size=4))

    def bound(i: int, j: int) -> float:
        return sum(weights[i:j]) + 0.1 * (j - i) ** 0.5

    def true(i: int, j: int, k: int) -> float:
        if (i, j) in blocked:
            return math.inf
        return bound(i, j) + (penalty * (stages - k) if j - i > 2 else 0.0)  # early stages hold more micro-batches

    expected = _brute(count, stages, allowed, true, micro, stale)
    found = exact_cuts(count, stages, allowed, bound, true, micro_batches=micro, stale=stale)
    limit = data.draw(st.floats(0.0, 60.0))  # a plan found elsewhere: the DP gives up only if it cannot beat it
    limited = exact_cuts(count, stages, allowed, bound, true, micro_batches=micro, stale=stale, limit_s=limit)
    assert (limited is None) == (expected >= limit)
    assert limited is None or limited.objective_s == pytest.approx(expected, rel=1e-12, abs=1e-12)
    if not math.isfinite(expected):
        assert found is None
        return
    assert found is not None and found.objective_s == pytest.approx(expected, rel=1e-12, abs=1e-12)
    cuts = [*found.starts, count]
    assert found.stage_s == tuple(true(cuts[k], cuts[k + 1], k) for k in range(stages))
    assert found.starts[0] == 0 and set(found.starts[1:]) <= allowed


def test_a_balanced_cut_and_the_bubble_term() -> None:
    """Eight equal decisions into two stages: 4 + 4; with many micro-batches the largest stage dominates."""
    def time(i: int, j: int, k: int = 0) -> float:
        return float(j - i)

    found = exact_cuts(8, 2, range(1, 8), time, time, micro_batches=8)
    assert found is not None and found.starts == (0, 4) and found.objective_s == 8 + 7 * 4
    uneven = exact_cuts(8, 2, {1, 2, 7}, time, time, micro_batches=8)
    assert uneven is not None and uneven.starts == (0, 2) and uneven.stage_s == (2.0, 6.0)
    assert exact_cuts(8, 3, {4}, time, time) is None  # two stages at most from one allowed point

