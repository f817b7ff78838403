"""Padding modes across tiles: which input row every padded row of a tile's window reads, and from which tile.

A window operation (a convolution, or ``F.pad`` itself: a window of one row)
over an input of ``E`` rows padded by ``before`` rows in front and ``after``
behind reads padded rows ``−before … E + after − 1``. Row ``r`` inside
``[0, E)`` is input row ``r``; outside it is, by mode (PyTorch's ``F.pad``):

* ``zeros``/``constant``: the fill value (no input row: :func:`source_row` is ``None``);
* ``reflect``: the mirror image without the edge row (``−1 → 1``, ``E → E − 2``);
* ``replicate``: the edge row (``−1 → 0``, ``E → E − 1``);
* ``circular``: the row one period away (``−1 → E − 1``, ``E → 0``) — periodic
  boundaries, where the first and last tiles exchange halos with each other.

The modes are separable (a 2-D reflection is the reflection of rows, then of
columns), so a tile of a 2-D split gathers its rows, then the columns of that
row-extended tile. A tile reads the rows of its own part and of the tiles next
to it only — next along a ring for ``circular`` — so a tile exchanges with two
neighbours per axis as a zero-padded one does (:func:`gathered_halos` refuses
other splits; the cost model prices these halos with
``cost_models.halo.halo_messages``).

Assumptions:
    * Parts are balanced (``cost_models.halo.partition``); the producer of the
      input used the same split.
    * PyTorch's own limits hold for the whole tensor (``reflect`` pads less
      than ``E`` rows, ``circular`` at most ``E``): the model ran when traced.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from cost_models.errors import InputError
from cost_models.halo import AxisHalo, partition

__all__ = ["MODES", "axis_pads", "gathered_halos", "owner_of", "source_row", "tile_sources", "window_extent",
           "window_reads"]

MODES = ("zeros", "constant", "reflect", "replicate", "circular")


def source_row(row: int, extent: int, mode: str) -> int | None:
    """The input row padded row ``row`` reads (``None``: the fill value of ``zeros``/``constant`` padding)."""
    if 0 <= row < extent:
        return row
    if mode in ("zeros", "constant"):
        return None
    if mode == "reflect":
        return -row if row < 0 else 2 * (extent - 1) - row
    if mode == "replicate":
        return min(max(row, 0), extent - 1)
    if mode == "circular":
        return row % extent
    raise InputError(f"unknown padding mode {mode!r}; use one of {', '.join(MODES)}")


def axis_pads(attrs: dict[str, Any], axis: int, extent: int | None = None) -> tuple[int, int]:
    """``(before, after)`` padding of a convolution's axis (0: height, 1: width): explicit, PyTorch's ``'same'``
    (reach ``d·(k−1)`` split with the extra row after), ``'valid'``, or the traced pads of TensorFlow's 'SAME'."""
    padding = attrs.get("padding", 0)
    if "pads" in attrs:  # TensorFlow's 'SAME', from the traced input's extent (cost_models.ir.classify)
        before, after = attrs["pads"][axis]
        return int(before), int(after)
    if padding == "valid":
        return 0, 0
    if padding == "same":
        reach = _axis(attrs.get("dilation", 1), axis) * (_axis(attrs.get("kernel_size", 1), axis) - 1)
        return reach // 2, reach - reach // 2
    value = _axis(padding, axis)
    return int(value), int(value)


def window_extent(extent: int, kernel: int, stride: int, dilation: int, pads: tuple[int, int]) -> int:
    """Output rows of a window over ``extent`` rows padded by ``pads`` (floor mode, as ``nn.Conv2d``)."""
    return (extent + pads[0] + pads[1] - dilation * (kernel - 1) - 1) // stride + 1


def window_reads(extent: int, parts: int, kernel: int, stride: int, dilation: int,
                 pads: tuple[int, int]) -> list[tuple[int, int]]:
    """Per tile, the padded rows ``[start, stop)`` (input coordinates, outside ``[0, extent)``: padding) its
    output rows ``partition(O, parts)[t]`` read."""
    extent_out = window_extent(extent, kernel, stride, dilation, pads)
    return [(o0 * stride - pads[0], (o1 - 1) * stride - pads[0] + dilation * (kernel - 1) + 1)
            for o0, o1 in partition(extent_out, parts)]


def tile_sources(extent: int, reads: tuple[int, int], mode: str) -> list[int | None]:
    """The input row (``None``: fill) of each padded row of ``reads``, in order."""
    return [source_row(row, extent, mode) for row in range(*reads)]


def gathered_halos(extent: int, reads: Sequence[tuple[int, int]], mode: str) -> list[AxisHalo]:
    """Per tile, the rows read from other tiles: ``before``/``after`` its own rows (by padded position).

    Raises:
        InputError: A tile would read a row of a tile other than itself and its neighbours (ring neighbours
            for ``circular``), or would read no input row at all.
    """
    parts = len(reads)
    owned = partition(extent, parts)
    halos = []
    for tile, (start, stop) in enumerate(reads):
        near = {tile, tile - 1, tile + 1} if mode != "circular" else {tile, (tile - 1) % parts, (tile + 1) % parts}
        own_start, own_stop = owned[tile]
        beyond = (range(start, min(stop, own_start)), range(max(start, own_stop), stop))  # rows not its own
        counts = []
        for positions in beyond:
            rows = [row for row in (source_row(p, extent, mode) for p in positions)
                    if row is not None and not own_start <= row < own_stop]
            if any(owner_of(row, owned) not in near for row in rows):
                raise InputError(f"a {parts}-way split of {extent} rows is too fine for {mode} padding of this "
                                 f"window: tile {tile} would read beyond its neighbours")
            counts.append(len(rows))
        if mode in ("zeros", "constant") and (stop <= 0 or start >= extent):
            raise InputError(f"a {parts}-way split of {extent} rows leaves tile {tile} reading padding only")
        halos.append(AxisHalo(counts[0], counts[1]))
    return halos


def owner_of(row: int, owned: Sequence[tuple[int, int]]) -> int:
    """The part of ``owned`` (balanced, in order) that holds ``row``."""
    return bisect_right([start for start, _ in owned], row) - 1


def _axis(value: Any, axis: int) -> int:
    """One axis of a per-axis value (``[3, 3]``, ``3``; a 1-D layer's ``[3]`` is the same on every axis)."""
    if isinstance(value, (list, tuple)):
        return int(value[axis] if axis < len(value) else value[-1])
    return int(value)
