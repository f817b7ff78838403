"""Halo regions of spatially split convolutions and pooling, from exact index arithmetic.

A dimension of output extent ``O`` split into ``parts`` tiles gives tile ``t``
the output rows of ``partition(O, parts)[t]``. Producing output rows
``[o0, o1)`` of a window of size ``k``, stride ``s``, dilation ``d`` and padding
``p`` reads input rows ``[o0·s − p, (o1−1)·s − p + d·(k−1)]``, clipped to
``[0, I)``: rows outside are the global padding, which only border tiles see.
The tile owns input rows ``partition(I, parts)[t]`` (its producer used the same
split), so its halo is what it reads beyond them on each side: received from
the neighbour before the forward pass, and — as the gradient of those rows —
sent back and added to the neighbour's input gradient after backward-data.

With pooling's ``ceil_mode`` the output has one more row when a last, partial
window starts inside the input or its left padding; it reads what it overhangs
of the input only (the rows past the right padding do not exist).

Assumptions:
    * Parts are balanced (``torch.tensor_split``): sizes differ by at most one,
      the first ``E mod parts`` parts are the larger.
    * A halo never reaches past the adjacent tile (:func:`axis_halos` refuses
      such splits; the planner does not offer them).
    * A 2-D (h×w) split exchanges with up to eight neighbours: four edges and,
      when both halos on a corner are non-zero, the corner block.
    * A volume's tile exchanges as ``runtime.halo_exchange`` does, one axis
      after the other (:func:`volume_halo_messages`): two messages per split
      axis, each a face of the tile extended by the halos of the axes before
      (edges and corners travel inside the later faces).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from cost_models.errors import InputError

__all__ = ["AxisHalo", "HaloMessage", "adaptive_reads", "axis_halos", "distinct_axis_halos", "halo_messages",
           "partition", "reads_beyond_neighbours", "volume_halo_messages", "window_output_extent"]


@dataclass(frozen=True)
class AxisHalo:
    """Rows a tile reads beyond its own input rows on one axis: ``before`` and ``after``."""

    before: int
    after: int


@dataclass(frozen=True)
class HaloMessage:
    """One halo message of a tile: its neighbour offset ``(dh, dw)`` (``(dd, dh, dw)`` of a volume), shape of the
    block (a volume's: its rows are slices × rows) and bytes."""

    offset: tuple[int, ...]
    rows: int
    cols: int
    nbytes: int


def partition(extent: int, parts: int) -> list[tuple[int, int]]:
    """Balanced ``[start, stop)`` ranges of ``extent`` split into ``parts`` (as ``torch.tensor_split``)."""
    if parts < 1 or extent < parts:
        raise InputError(f"cannot split an extent of {extent} into {parts} non-empty parts")
    base, extra = divmod(extent, parts)
    bounds, start = [], 0
    for index in range(parts):
        stop = start + base + (1 if index < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def adaptive_reads(extent_in: int, extent_out: int, o0: int, o1: int) -> tuple[int, int]:
    """The input rows ``[i0, i1)`` that adaptive pooling's output rows ``[o0, o1)`` read: output row ``o`` averages
    rows ``⌊o·I/O⌋ … ⌈(o+1)·I/O⌉ − 1`` (PyTorch's windows)."""
    return o0 * extent_in // extent_out, -(-o1 * extent_in // extent_out)


def reads_beyond_neighbours(extent_in: int, extent_out: int, parts: int,
                            reads: Callable[[int, int], tuple[int, int]]) -> int | None:
    """The first tile of ``parts`` whose output rows read input rows beyond its adjacent tiles' (``None``: none)."""
    owned = partition(extent_in, parts)
    for index, (o0, o1) in enumerate(partition(extent_out, parts)):
        start, stop = reads(o0, o1)
        low = owned[index - 1][0] if index > 0 else 0
        high = owned[index + 1][1] if index + 1 < parts else extent_in
        if max(start, 0) < low or min(stop, extent_in) > high:
            return index
    return None


def window_output_extent(extent: int, kernel: int, stride: int, dilation: int, padding: int,
                         ceil_mode: bool = False) -> int:
    """Output extent of a window operation, as ``torch.nn.Conv2d`` (floor) and pooling with ``ceil_mode``
    compute it (ceil, and no window starting in the right padding)."""
    span = extent + 2 * padding - dilation * (kernel - 1) - 1
    if not ceil_mode:
        return span // stride + 1
    extent_out = -(-span // stride) + 1
    return extent_out - 1 if (extent_out - 1) * stride >= extent + padding else extent_out


def axis_halos(extent_in: int, parts: int, kernel: int, stride: int = 1, dilation: int = 1,
               padding: int = 0, ceil_mode: bool = False) -> list[AxisHalo]:
    """Per-tile halo widths on one axis (``ceil_mode``: pooling's; the last window may overhang the padding).

    Raises:
        InputError: A tile would need rows beyond its adjacent tile, or the
            split leaves a tile without output rows.
    """
    halos, refusal = _axis_halos(extent_in, parts, kernel, stride, dilation, padding, ceil_mode)
    if refusal is not None:
        raise InputError(refusal)
    return list(halos)


def distinct_axis_halos(extent_in: int, parts: int, kernel: int, stride: int = 1, dilation: int = 1,
                        padding: int = 0, ceil_mode: bool = False) -> tuple[AxisHalo, ...]:
    """The distinct values of :func:`axis_halos`, in tile order (a tile's messages depend only on its halos, which
    take few values however many tiles there are; remembered).

    Raises:
        InputError: As :func:`axis_halos`.
    """
    halos, refusal = _distinct(extent_in, parts, kernel, stride, dilation, padding, ceil_mode)
    if refusal is not None:
        raise InputError(refusal)
    return halos


@lru_cache(maxsize=65536)
def _distinct(extent_in: int, parts: int, kernel: int, stride: int, dilation: int, padding: int,
              ceil_mode: bool) -> tuple[tuple[AxisHalo, ...], str | None]:
    halos, refusal = _axis_halos(extent_in, parts, kernel, stride, dilation, padding, ceil_mode)
    return tuple(dict.fromkeys(halos)), refusal


@lru_cache(maxsize=65536)
def _axis_halos(extent_in: int, parts: int, kernel: int, stride: int, dilation: int, padding: int,
                ceil_mode: bool) -> tuple[tuple[AxisHalo, ...], str | None]:
    """:func:`axis_halos` (remembered: the search asks the same axes again and again), or why not."""
    try:
        extent_out = window_output_extent(extent_in, kernel, stride, dilation, padding, ceil_mode)
        owned = partition(extent_in, parts)
        tiles = partition(extent_out, parts)
    except InputError as err:
        return (), str(err)
    halos = []
    for tile, (o0, o1) in enumerate(tiles):
        need_start, need_stop = _rows_read(o0, o1, extent_in, kernel, stride, dilation, padding)
        own_start, own_stop = owned[tile]
        halo = AxisHalo(max(0, own_start - need_start), max(0, need_stop - own_stop))
        if (tile > 0 and halo.before > owned[tile - 1][1] - owned[tile - 1][0]) or (
                tile + 1 < parts and halo.after > owned[tile + 1][1] - owned[tile + 1][0]):
            return (), (f"a {parts}-way split of extent {extent_in} is too fine for a window of {kernel} "
                        f"(stride {stride}, dilation {dilation}): tile {tile} needs rows beyond its neighbour")
        halos.append(halo)
    return tuple(halos), None


def _rows_read(o0: int, o1: int, extent_in: int, kernel: int, stride: int, dilation: int,
               padding: int) -> tuple[int, int]:
    """``[first, last + 1)`` of the input rows that output rows ``[o0, o1)`` read (taps in the padding excluded).

    Near a border a dilated window's first or last in-range tap depends on the
    output row, so the few outputs whose windows reach into the padding are
    examined one by one.
    """
    span = dilation * (kernel - 1)
    first = extent_in
    for o in range(o0, o1):
        start = o * stride - padding
        tap = start if start >= 0 else start + dilation * -(start // dilation)
        if tap <= min(start + span, extent_in - 1):  # a window wholly in the padding reads nothing
            first = min(first, tap)
        if start >= 0:
            break
    last = -1
    for o in range(o1 - 1, o0 - 1, -1):
        start = o * stride - padding
        end = start + span
        tap = end if end < extent_in else start + dilation * ((extent_in - 1 - start) // dilation)
        if tap >= max(start, 0):
            last = max(last, tap)
        if end < extent_in:
            break
    return first, last + 1


def halo_messages(rows: Sequence[AxisHalo], cols: Sequence[AxisHalo], tile: tuple[int, int],
                  tile_shape: tuple[int, int], plane_bytes: int) -> list[HaloMessage]:
    """The messages tile ``(i, j)`` receives for one exchange (and sends back as gradients).

    Args:
        rows: Per-tile halos along height (length = height parts).
        cols: Per-tile halos along width (length = width parts).
        tile: The tile's ``(row, column)`` index.
        tile_shape: Its own input extent ``(rows, cols)``.
        plane_bytes: Bytes of one spatial element across the local batch and
            channels (``N_local · C_local · itemsize``).
    """
    i, j = tile
    row_halo, col_halo = rows[i], cols[j]
    sides = {(-1, 0): (row_halo.before, tile_shape[1]), (1, 0): (row_halo.after, tile_shape[1]),
             (0, -1): (tile_shape[0], col_halo.before), (0, 1): (tile_shape[0], col_halo.after),
             (-1, -1): (row_halo.before, col_halo.before), (-1, 1): (row_halo.before, col_halo.after),
             (1, -1): (row_halo.after, col_halo.before), (1, 1): (row_halo.after, col_halo.after)}
    return [HaloMessage(offset, height, width, height * width * plane_bytes)
            for offset, (height, width) in sides.items() if height > 0 and width > 0]


def volume_halo_messages(halos: Sequence[AxisHalo], tile_shape: Sequence[int], plane_bytes: int) -> list[HaloMessage]:
    """The messages a volume's tile receives for one exchange, axis after axis (depth, rows, columns): before and
    after along each, the face of the tile as extended by the halos already received.

    Args:
        halos: The tile's halo along each spatial axis (``AxisHalo(0, 0)`` where the axis is not split).
        tile_shape: Its own input extents ``(slices, rows, columns)``.
        plane_bytes: Bytes of one spatial element across the local batch and channels.
    """
    extents, found = list(tile_shape), []
    for axis, halo in enumerate(halos):
        for sign, depth in ((-1, halo.before), (1, halo.after)):
            block = [depth if a == axis else extent for a, extent in enumerate(extents)]
            if depth > 0 and min(block) > 0:
                offset = tuple(sign if a == axis else 0 for a in range(len(extents)))
                rows = 1
                for extent in block[:-1]:
                    rows *= extent
                found.append(HaloMessage(offset, rows, block[-1], rows * block[-1] * plane_bytes))
        extents[axis] += halo.before + halo.after
    return found
