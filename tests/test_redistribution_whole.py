"""Tier 1: a dimension of extent 1 is held whole — the cost model's redistribution equals the runtime's moves."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.layout import Layout
from cost_models.redistribution import holdable, rank_loads, redistribution
from runtime.placement import Placement
from runtime.redistribute import moves


def _runtime_receives(shape: tuple[int, ...], source: Layout, target: Layout, devices: int, rank: int
                      ) -> tuple[int, tuple[int, ...]]:
    """Elements and peers of ``rank`` in the runtime's own plan of the move (``runtime.redistribute.moves``)."""
    _, receives = moves(shape, Placement(source), Placement(target), tuple(range(devices)), rank)
    elements = 0
    for _, box in receives:
        size = 1
        for start, stop in box:
            size *= stop - start
        elements += size
    return elements, tuple(sorted(peer for peer, _ in receives))


@settings(max_examples=120, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 4), st.integers(1, 5), st.sampled_from([1, 1, 2, 5]), st.sampled_from([1, 1, 3, 4])),
    source=st.tuples(*[st.sampled_from([1, 2, 3]) for _ in range(4)]),
    target=st.tuples(*[st.sampled_from([1, 2, 4]) for _ in range(4)]),
    copies=st.sampled_from([1, 2]),
)
def test_moves_with_whole_extents_equal_the_runtime(shape: tuple[int, ...], source: tuple[int, ...],
                                                    target: tuple[int, ...], copies: int) -> None:
    src, dst = _layout(*source), _layout(*target)
    if not (holdable(shape, src) and holdable(shape, dst)) or src.ranks * dst.ranks * copies > 48:
        return
    devices = src.ranks * dst.ranks * copies
    loads = rank_loads(shape, src, dst, devices)
    for transfer in redistribution(shape, src, dst, devices):
        rank = transfer.rank
        assert (transfer.elements, transfer.peers) == _runtime_receives(shape, src, dst, devices, rank)
        assert loads.elements[rank] == transfer.elements
        assert loads.peers[rank] == len(transfer.peers)
        assert loads.lowest[rank] == min((rank, *transfer.peers))
        assert loads.highest[rank] == max((rank, *transfer.peers))


def test_a_broadcast_scale_read_by_a_row_split_is_gathered_whole() -> None:
    # (2, 4, 1, 1) split by samples on 2 ranks, read under h2: each rank wants every sample (rows are whole).
    transfers = redistribution((2, 4, 1, 1), Layout(n=2), Layout(h=2), 2)
    assert [(t.elements, t.peers) for t in transfers] == [(4, (1,)), (4, (0,))]
    # held under h2 (every rank a copy), read under n2: nothing moves.
    assert all(t.elements == 0 for t in redistribution((2, 4, 1, 1), Layout(h=2), Layout(n=2), 2))


def test_an_extent_split_into_empty_parts_is_still_refused() -> None:
    assert not holdable((2, 4, 3, 1), Layout(h=4)) and holdable((2, 4, 1, 1), Layout(h=4))
    with pytest.raises(Exception, match="non-empty parts"):
        rank_loads((2, 4, 3, 1), Layout(h=4), Layout(), 4)


def _layout(n: int, c: int, h: int, w: int) -> Layout:
    return Layout(n=n, c=c, h=h, w=w)
