"""Tier 1: communication costs computed by hand from α and β."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.cluster import Cluster, Link
from cost_models.comm_cost import allreduce_s, halo_exchange_s, redistribution_s
from cost_models.halo import axis_halos, halo_messages
from cost_models.layout import Layout
from cost_models.profile import CommFit, DeviceSpec, Profile

A_INTRA, B_INTRA = 1e-5, 1e-9
A_INTER, B_INTER = 5e-5, 1e-8
FITS = tuple(CommFit(collective, level, alpha, beta, 0)
             for collective in ("allreduce", "allgather", "reduce_scatter", "all_to_all", "sendrecv")
             for level, alpha, beta in (("intra", A_INTRA, B_INTRA), ("inter", A_INTER, B_INTER)))
PROFILE = Profile(DeviceSpec("test", 2**30), {"source": "measured"}, comm_fits=FITS)
CLUSTER = Cluster(devices=16, devices_per_node=4, memory_bytes=2**30, intra=Link(A_INTRA, 1 / B_INTRA),
                  inter=Link(A_INTER, 1 / B_INTER))


def test_ring_allreduce_inside_a_node() -> None:
    n = 1e6
    assert allreduce_s(PROFILE, CLUSTER, [0, 1, 2, 3], n) == pytest.approx(6 * A_INTRA + 1.5 * n * B_INTRA)
    assert allreduce_s(PROFILE, CLUSTER, [5], n) == 0.0


def test_hierarchical_allreduce_across_nodes() -> None:
    n = 8e6
    ranks = list(range(8))  # two nodes of four
    inside = 2 * (3 * A_INTRA + 0.75 * n * B_INTRA)  # reduce-scatter + allgather over 4
    between = 2 * A_INTER + 2 * 0.5 * (n / 4) * B_INTER  # ring allreduce over 2 nodes of a quarter each
    assert allreduce_s(PROFILE, CLUSTER, ranks, n) == pytest.approx(inside + between)


@given(st.integers(2, 16), st.floats(1e3, 1e9), st.floats(1.01, 4.0))
def test_larger_messages_never_cost_less(group: int, nbytes: float, factor: float) -> None:
    ranks = list(range(group))
    assert allreduce_s(PROFILE, CLUSTER, ranks, nbytes * factor) >= allreduce_s(PROFILE, CLUSTER, ranks, nbytes) >= 0


def test_halo_exchange_of_a_3x3_convolution_split_two_ways() -> None:
    rows = axis_halos(64, 2, kernel=3, padding=1)
    messages = halo_messages(rows, axis_halos(64, 1, 3, padding=1), (0, 0), (32, 64), plane_bytes=8 * 16 * 4)
    (message,) = messages
    assert message.nbytes == 64 * 8 * 16 * 4
    assert halo_exchange_s(PROFILE, messages, "intra") == pytest.approx(A_INTRA + message.nbytes * B_INTRA)


def test_redistribution_cost_of_the_busiest_rank() -> None:
    # (8, 4, 8, 8) float32 from n4 to h4 on 4 ranks: each rank keeps a quarter of its rows,
    # receives 3 blocks of 2x4x2x8 from 3 peers.
    seconds = redistribution_s(PROFILE, CLUSTER, (8, 4, 8, 8), 4, Layout(n=4), Layout(h=4), 4)
    block_bytes = 2 * 4 * 2 * 8 * 4
    assert seconds == pytest.approx(3 * A_INTRA + 3 * block_bytes * B_INTRA)
    assert redistribution_s(PROFILE, CLUSTER, (8, 4, 8, 8), 4, Layout(n=4), Layout(n=4), 4) == 0.0
    across = redistribution_s(PROFILE, CLUSTER, (8, 4, 8, 8), 4, Layout(n=8), Layout(h=8), 8)
    assert across > seconds  # peers on the other node use the slower link


@settings(max_examples=60, deadline=None)
@given(
    source=st.tuples(*[st.sampled_from([1, 2, 4]) for _ in range(4)]),
    target=st.tuples(*[st.sampled_from([1, 2, 4]) for _ in range(4)]),
    scale=st.tuples(*[st.sampled_from([1, 2, 3]) for _ in range(4)]),
    per_node=st.sampled_from([1, 2, 4, 8]),
)
def test_move_patterns_give_the_per_rank_answer(source: tuple[int, ...], target: tuple[int, ...],
                                                scale: tuple[int, ...], per_node: int) -> None:
    from calibrate.presets import preset_profile
    from cost_models.comm_cost import move_patterns, nested, pattern_s, redistribution_s, sendrecv_coefficients

    src, dst = _layout(*source), _layout(*target)
    devices = max(src.ranks, dst.ranks) * 2
    if devices % src.ranks or devices % dst.ranks:
        return
    shape = tuple(4 * k for k in scale)
    if not nested(src, dst, shape):
        return
    profile = preset_profile("a100")
    cluster = Cluster(devices, min(per_node, devices), 10**9, Link(1e-6, 1e10), Link(1e-5, 1e9))
    pattern = move_patterns(cluster, src, [dst], devices)[0]
    expected = redistribution_s(profile, cluster, shape, 4, src, dst, devices)
    seconds = pattern_s(sendrecv_coefficients(profile, 4), pattern, shape, src, dst)
    assert seconds == pytest.approx(expected, rel=1e-12, abs=1e-15)


def _examined_patterns(cluster: Cluster, source: Layout, targets: list[Layout], devices: int) -> list:
    """The move patterns by examining every rank's boxes (``rank_loads``): the closed forms' reference."""
    from math import lcm

    import numpy as np

    from cost_models.comm_cost import PATTERN_CASES, MovePattern
    from cost_models.redistribution import rank_loads

    extents = [lcm(p, *(target.parts()[d] for target in targets)) for d, p in enumerate(source.parts())]
    loads = rank_loads(extents, source, targets, devices)
    spans = loads.lowest // cluster.devices_per_node != loads.highest // cluster.devices_per_node
    wanted = np.prod([e // q for e, q in zip(extents, np.array([t.parts() for t in targets]).T)], axis=0)
    holds = loads.elements < wanted[:, None]
    parts = (loads.peers + holds).max(axis=1)
    present = {case: np.any((holds == case[0]) & (spans == case[1]), axis=1) for case in PATTERN_CASES}
    return [MovePattern(int(parts[i]), tuple(case for case in PATTERN_CASES if present[case][i]))
            for i in range(len(targets))]


@settings(max_examples=120, deadline=None)
@given(devices=st.sampled_from([1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256]), depth=st.booleans(),
       per_node=st.sampled_from([1, 2, 3, 4, 6, 8, 16, 128]), picks=st.lists(st.integers(0, 10**6), min_size=13,
                                                                              max_size=13))
def test_move_patterns_closed_forms_equal_examining_every_rank(devices: int, depth: bool, per_node: int,
                                                               picks: list[int]) -> None:
    from cost_models.comm_cost import move_patterns, nested
    from cost_models.layout import layouts_dividing

    if devices % per_node and per_node < devices:
        return
    layouts = layouts_dividing(devices, depth=depth)
    source = layouts[picks[0] % len(layouts)]
    targets = [layouts[pick % len(layouts)] for pick in picks[1:]]
    targets = [t for t in targets if nested(source, t, [max(a, b) for a, b in zip(source.parts(), t.parts())])]
    if not targets:
        return
    cluster = Cluster(devices, per_node, 10**9, Link(1e-6, 1e10), Link(1e-5, 1e9))
    assert move_patterns(cluster, source, targets, devices) == _examined_patterns(cluster, source, targets, devices)


def _layout(n: int, c: int, h: int, w: int) -> Layout:
    return Layout(n=n, c=c, h=h, w=w)
