"""Tier 1: the stage-cut DP (planner.pipeline.cuts) against brute force over every cut, with lazy true times."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.pipeline.cuts import exact_cuts, fits_nodes


def _brute(count, stages, allowed, true, micro, stale, sizes=(1,), budget=None, node=None):  # noqa: ANN001, ANN202
    """The least objective over every cut and every assignment of sizes to stages within the budget (each stage
    whole nodes from a node's first device, or inside one node, with ``node`` devices per node)."""
    budget = stages * max(sizes) if budget is None else budget
    best = math.inf
    for starts in itertools.combinations(sorted(p for p in set(allowed) if 0 < p < count), stages - 1):
        cuts = [0, *starts, count]
        for devices in itertools.product(sizes, repeat=stages):
            if sum(devices) > budget or not all(fits_nodes(sum(devices[:k]), devices[k], node, budget)
                                                for k in range(stages)):
                continue
            times = [true(cuts[k], cuts[k + 1], k, devices[k]) for k in range(stages)]
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

    def bound(i: int, j: int, size: int = 1) -> float:
        return sum(weights[i:j]) + 0.1 * (j - i) ** 0.5

    def true(i: int, j: int, k: int, size: int = 1) -> float:
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
    def time(i: int, j: int, k: int = 0, size: int = 1) -> float:
        return float(j - i)

    found = exact_cuts(8, 2, range(1, 8), time, time, micro_batches=8)
    assert found is not None and found.starts == (0, 4) and found.objective_s == 8 + 7 * 4
    uneven = exact_cuts(8, 2, {1, 2, 7}, time, time, micro_batches=8)
    assert uneven is not None and uneven.starts == (0, 2) and uneven.stage_s == (2.0, 6.0)
    assert exact_cuts(8, 3, {4}, time, time) is None  # two stages at most from one allowed point



@settings(max_examples=150, deadline=None)
@given(st.integers(2, 7), st.integers(1, 4), st.integers(1, 5), st.booleans(), st.data())
def test_the_dp_splits_the_devices_as_brute_force_does(count: int, stages: int, micro: int, stale: bool,
                                                      data: st.DataObject) -> None:
    """Stages of different device counts: a stage's time shrinks with its devices by its own scaling (random),
    a per-stage memory penalty that more devices relieve, some segments that fit no size, nodes of 2 or 4
    devices (or none); every cut and every assignment of sizes within the budget tried by brute force."""
    sizes = tuple(sorted(data.draw(st.sets(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=3))))
    budget = data.draw(st.integers(stages * min(sizes), stages * max(sizes)))
    weights = data.draw(st.lists(st.floats(0.1, 5.0), min_size=count, max_size=count))
    scaling = data.draw(st.lists(st.floats(0.3, 1.0), min_size=count, max_size=count))  # 1: perfect speed-up
    allowed = data.draw(st.sets(st.integers(1, count - 1))) if count > 1 else set()
    penalty = data.draw(st.floats(0.0, 3.0))
    blocked = data.draw(st.sets(st.tuples(st.integers(0, count), st.integers(0, count), st.sampled_from(sizes)),
                                max_size=4))

    def bound(i: int, j: int, size: int) -> float:
        return sum(w / size ** s for w, s in zip(weights[i:j], scaling[i:j]))

    def true(i: int, j: int, k: int, size: int) -> float:
        if (i, j, size) in blocked:
            return math.inf
        return bound(i, j, size) + (penalty * (stages - k) / size if j - i > 2 else 0.0)

    node = data.draw(st.sampled_from([None, 2, 4]))  # devices per node: stages keep to whole nodes or one node
    expected = _brute(count, stages, allowed, true, micro, stale, sizes, budget, node)
    found = exact_cuts(count, stages, allowed, bound, true, sizes=sizes, budget=budget, micro_batches=micro,
                       stale=stale, node=node)
    if not math.isfinite(expected):
        assert found is None
        return
    assert found is not None and found.objective_s == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert sum(found.devices) <= budget and set(found.devices) <= set(sizes)
    assert all(fits_nodes(sum(found.devices[:k]), found.devices[k], node, budget) for k in range(stages))
    cuts = [*found.starts, count]
    assert found.stage_s == tuple(true(cuts[k], cuts[k + 1], k, found.devices[k]) for k in range(stages))
