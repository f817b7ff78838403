"""Tier 1: halo widths and messages, known answers computed by hand."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cost_models.errors import InputError
from cost_models.halo import AxisHalo, axis_halos, halo_messages, partition, window_output_extent


def test_partition_is_balanced() -> None:
    assert partition(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert partition(8, 2) == [(0, 4), (4, 8)]
    with pytest.raises(InputError, match="non-empty parts"):
        partition(3, 4)


def test_3x3_same_convolution_two_and_four_ways() -> None:
    # 3x3, stride 1, padding 1 on 16 rows: every inner boundary needs one row each way.
    assert axis_halos(16, 2, kernel=3, padding=1) == [AxisHalo(0, 1), AxisHalo(1, 0)]
    assert axis_halos(16, 4, kernel=3, padding=1) == [AxisHalo(0, 1), AxisHalo(1, 1), AxisHalo(1, 1), AxisHalo(1, 0)]


def test_strided_7x7_convolution() -> None:
    # ResNet's stem: 7x7, stride 2, padding 3 on 224 rows -> 112 output rows.
    # 2 ways: tile 0 makes output rows 0..55, reading input rows up to 55*2-3+6 = 113 -> 2 rows past 111.
    #         tile 1 makes rows 56..111, starting at input row 56*2-3 = 109 -> 3 rows before 112.
    assert window_output_extent(224, 7, 2, 1, 3) == 112
    assert axis_halos(224, 2, kernel=7, stride=2, padding=3) == [AxisHalo(0, 2), AxisHalo(3, 0)]
    # 4 ways: output 28 rows each; input tiles of 56 rows.
    assert axis_halos(224, 4, kernel=7, stride=2, padding=3) == [
        AxisHalo(0, 2), AxisHalo(3, 2), AxisHalo(3, 2), AxisHalo(3, 0)]


def test_dilation_widens_the_halo() -> None:
    assert axis_halos(32, 2, kernel=3, dilation=2, padding=2) == [AxisHalo(0, 2), AxisHalo(2, 0)]


def test_non_overlapping_pooling_needs_no_halo() -> None:
    assert axis_halos(16, 4, kernel=2, stride=2) == [AxisHalo(0, 0)] * 4
    # 3x3 max-pool stride 2 padding 1 (ResNet) on 112 rows, 2 ways: 56 outputs, tile 1 starts at row 55.
    assert axis_halos(112, 2, kernel=3, stride=2, padding=1) == [AxisHalo(0, 0), AxisHalo(1, 0)]


def test_too_fine_a_split_is_refused() -> None:
    with pytest.raises(InputError, match="needs rows beyond its neighbour"):
        axis_halos(8, 8, kernel=5, padding=2)


def test_messages_of_a_2x2_split_include_corners() -> None:
    rows = axis_halos(16, 2, kernel=3, padding=1)
    cols = axis_halos(16, 2, kernel=3, padding=1)
    plane = 4 * 8 * 4  # N_local=4, C=8, float32
    messages = halo_messages(rows, cols, (0, 0), (8, 8), plane)
    assert {m.offset: (m.rows, m.cols) for m in messages} == {(1, 0): (1, 8), (0, 1): (8, 1), (1, 1): (1, 1)}
    assert sum(m.nbytes for m in messages) == (8 + 8 + 1) * plane
    inner = halo_messages(axis_halos(24, 3, 3, padding=1), axis_halos(24, 3, 3, padding=1), (1, 1), (8, 8), 1)
    assert len(inner) == 8 and sum(m.nbytes for m in inner) == 4 * 8 + 4


def test_one_dimensional_split_has_no_width_messages() -> None:
    rows = axis_halos(16, 4, kernel=3, padding=1)
    cols = [AxisHalo(0, 0)]
    messages = halo_messages(rows, cols, (1, 0), (4, 16), 2)
    assert sorted(m.offset for m in messages) == [(-1, 0), (1, 0)]
    assert all(m.nbytes == 16 * 2 for m in messages)


@given(extent=st.integers(8, 256), parts=st.integers(1, 8), kernel=st.sampled_from([1, 3, 5, 7]),
       stride=st.integers(1, 3), dilation=st.integers(1, 3))
@example(extent=8, parts=2, kernel=7, stride=2, dilation=2)  # a dilated window clipped by the border
def test_halos_cover_exactly_what_each_tile_reads(extent: int, parts: int, kernel: int, stride: int, dilation: int) -> None:
    padding = dilation * (kernel - 1) // 2
    out = window_output_extent(extent, kernel, stride, dilation, padding)
    if out < parts or extent < parts:
        return
    try:
        halos = axis_halos(extent, parts, kernel, stride, dilation, padding)
    except InputError:
        return
    owned = partition(extent, parts)
    for tile, (o0, o1) in enumerate(partition(out, parts)):
        read = {row for o in range(o0, o1) for row in range(o * stride - padding, o * stride - padding
                                                             + dilation * (kernel - 1) + 1, dilation) if 0 <= row < extent}
        start, stop = owned[tile]
        span_start, span_stop = start - halos[tile].before, stop + halos[tile].after
        assert read <= set(range(span_start, span_stop))
        assert halos[tile].before == 0 or min(read) == span_start
        assert halos[tile].after == 0 or max(read) == span_stop - 1
        assert halos[tile].before >= 0 and halos[tile].after >= 0


def test_strided_7x7_under_a_2x2_split() -> None:
    rows = axis_halos(224, 2, kernel=7, stride=2, padding=3)
    cols = axis_halos(224, 2, kernel=7, stride=2, padding=3)
    plane = 8 * 3 * 4  # 8 samples, 3 channels, float32
    # tile (0, 0) owns 112x112 input and needs 2 rows below, 2 columns right, and the 2x2 corner.
    first = {m.offset: (m.rows, m.cols) for m in halo_messages(rows, cols, (0, 0), (112, 112), plane)}
    assert first == {(1, 0): (2, 112), (0, 1): (112, 2), (1, 1): (2, 2)}
    # tile (1, 1) needs 3 rows above, 3 columns left and the 3x3 corner.
    last = halo_messages(rows, cols, (1, 1), (112, 112), plane)
    assert sum(m.nbytes for m in last) == (3 * 112 + 112 * 3 + 3 * 3) * plane


def test_a_volume_tile_receives_its_faces_axis_after_axis() -> None:
    from cost_models.halo import volume_halo_messages

    halos = (AxisHalo(1, 1), AxisHalo(0, 1), AxisHalo(0, 0))  # depth split both ways, rows after only
    messages = volume_halo_messages(halos, (4, 8, 8), 2)
    # depth faces 1×8×8; then the rows' face of the depth-extended tile, 6×1×8 (its edges included)
    assert [(m.offset, m.nbytes) for m in messages] == [((-1, 0, 0), 128), ((1, 0, 0), 128), ((0, 1, 0), 96)]
    assert volume_halo_messages((AxisHalo(0, 0),) * 3, (4, 8, 8), 2) == []
