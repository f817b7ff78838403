"""Tier 1: redistribution volumes against explicit index sets on small tensors."""

from __future__ import annotations

from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.layout import Layout
from cost_models.redistribution import rank_box, rank_loads, redistribution


def elements(box: tuple[tuple[int, int], ...]) -> set[tuple[int, ...]]:
    return set(product(*(range(start, stop) for start, stop in box)))


def test_rank_boxes_tile_the_tensor() -> None:
    shape, layout = (4, 6, 8, 8), Layout(n=2, h=2, w=2)
    boxes = [elements(rank_box(shape, layout, r)) for r in range(8)]
    assert set().union(*boxes) == elements(tuple((0, e) for e in shape))
    assert sum(len(b) for b in boxes) == 4 * 6 * 8 * 8
    assert rank_box(shape, layout, 5) == ((2, 4), (0, 6), (0, 4), (4, 8))  # coordinates n1, h0, w1


def test_sample_to_height_split_known_answer() -> None:
    # 2 ranks, (2, 1, 4, 1): rank 0 holds sample 0, wants rows 0-1 of both samples -> receives 2 elements.
    transfers = redistribution((2, 1, 4, 1), Layout(n=2), Layout(h=2), 2)
    assert [(t.elements, t.peers) for t in transfers] == [(2, (1,)), (2, (0,))]


def test_same_layout_moves_nothing_and_replicas_keep_their_own() -> None:
    assert all(t.elements == 0 for t in redistribution((4, 3, 8, 8), Layout(n=2, h=2), Layout(n=2, h=2), 4))
    # replicated -> split: every rank already holds everything it needs.
    assert all(t.elements == 0 for t in redistribution((4, 3, 8, 8), Layout(), Layout(n=4), 4))
    # split -> replicated on 4 ranks: each gathers the 3 quarters it lacks, from 3 peers.
    gather = redistribution((4, 3, 8, 8), Layout(n=4), Layout(), 4)
    assert all(t.elements == 3 * 3 * 64 and len(t.peers) == 3 for t in gather)


@settings(max_examples=60, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 6), st.integers(1, 6)),
    source=st.tuples(st.sampled_from([1, 2]), st.sampled_from([1, 2]), st.sampled_from([1, 2]), st.sampled_from([1, 2])),
    target=st.tuples(st.sampled_from([1, 2]), st.sampled_from([1, 2]), st.sampled_from([1, 2]), st.sampled_from([1, 2])),
)
def test_volumes_match_explicit_index_sets(shape: tuple[int, ...], source: tuple[int, ...], target: tuple[int, ...]) -> None:
    src, dst = _layout(*source), _layout(*target)
    if not (src.fits(shape) and dst.fits(shape)):
        return
    devices = max(src.ranks, dst.ranks) * (2 if src.ranks == dst.ranks else 1)
    if devices % src.ranks or devices % dst.ranks:
        return
    for transfer in redistribution(shape, src, dst, devices):
        wanted = elements(rank_box(shape, dst, transfer.rank))
        held = elements(rank_box(shape, src, transfer.rank))
        assert transfer.elements == len(wanted - held)
        replica = (transfer.rank // src.ranks) * src.ranks
        expected_peers = tuple(q for q in range(replica, replica + src.ranks)
                               if q != transfer.rank and wanted & elements(rank_box(shape, src, q)))
        assert transfer.peers == expected_peers


def test_uneven_extents_use_balanced_parts() -> None:
    transfers = redistribution((1, 1, 5, 1), Layout(h=2), Layout(), 2)
    assert [t.elements for t in transfers] == [2, 3]  # rank 0 holds rows 0-2, rank 1 rows 3-4
    with pytest.raises(Exception, match="non-empty parts"):
        rank_box((1, 1, 1, 1), Layout(h=2), 0)


@settings(max_examples=80, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 5), st.integers(1, 6), st.integers(1, 9), st.integers(1, 9)),
    source=st.tuples(*[st.sampled_from([1, 2, 3]) for _ in range(4)]),
    target=st.tuples(*[st.sampled_from([1, 2, 4]) for _ in range(4)]),
    copies=st.sampled_from([1, 2]),
)
def test_rank_loads_equal_the_per_rank_reference(shape: tuple[int, ...], source: tuple[int, ...],
                                                 target: tuple[int, ...], copies: int) -> None:
    src, dst = _layout(*source), _layout(*target)
    if not (src.fits(shape) and dst.fits(shape)):
        return
    devices = src.ranks * dst.ranks * copies
    loads = rank_loads(shape, src, dst, devices)
    for transfer in redistribution(shape, src, dst, devices):
        rank = transfer.rank
        assert loads.elements[rank] == transfer.elements
        assert loads.peers[rank] == len(transfer.peers)
        assert loads.lowest[rank] == min((rank, *transfer.peers))
        assert loads.highest[rank] == max((rank, *transfer.peers))


def _layout(n: int, c: int, h: int, w: int) -> Layout:
    return Layout(n=n, c=c, h=h, w=w)
