"""Upsampling and transposed convolution on height/width tiles, equal to the unsplit operation's tile.

These operations make more output rows than they read, so a tile's output
rows ``partition(O, parts)[t]`` need not be the image of its input rows
``partition(I, parts)[t]`` when ``I`` does not divide evenly (13 rows in two
tiles: 7 + 6 input rows, 13 + 13 output rows). Each tile therefore works out
which input rows its output rows read, receives the ones its neighbours own
(:func:`runtime.halo_exchange.window_of_reads`), runs the operation on that
block without padding along the split axes, and crops (or pads with zeros)
the result to exactly its output rows. The crop keeps only rows whose every
contribution was present, so the result is exact; autograd's adjoints of the
crop and of the exchange send the halo gradients back to their owners.

Every tile builds the same sequence of autograd nodes (the zero padding is
applied even when empty): backward exchanges run in the order autograd's
engine reaches them, and ranks whose graphs differed in shape could reach
them in different orders and wait on each other.

Output row ``o`` reads, along one axis:
    * nearest, integer scale ``s``: input row ``⌊o/s⌋``;
    * bilinear (``align_corners=False``), integer scale ``s``: rows around
      ``(o + ½)/s − ½``, at most one row beyond ``⌊o/s⌋`` on each side;
    * transposed convolution (kernel ``k``, stride ``s``, dilation ``d``,
      padding ``p``): rows ``i`` with ``i·s − p ≤ o ≤ i·s − p + d(k−1)``;
    * adaptive average pooling to ``O`` of ``I`` rows: ``⌊o·I/O⌋ … ⌈(o+1)·I/O⌉ − 1``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F

from cost_models.halo import adaptive_reads, partition
from runtime.halo_exchange import exchange_halo, window_of_reads
from runtime.spatial import TileGrid, by_rank, ntuple

__all__ = ["adaptive_avg_pool2d", "conv_transpose2d", "interpolate", "pad2d"]

Reads = Callable[[int, int], tuple[int, int]]  # output rows [o0, o1) -> input rows [i0, i1) (may leave [0, I))
_LINEAR = {1: "linear", 2: "bilinear", 3: "trilinear"}
CONV_TRANSPOSE = {3: F.conv_transpose1d, 4: F.conv_transpose2d, 5: F.conv_transpose3d}


def interpolate(tile: torch.Tensor, grid: TileGrid, full_hw: tuple[int, ...], scale: Sequence[int],
                mode: str = "nearest", whole: tuple[bool, ...] | None = None) -> torch.Tensor:
    """This tile of ``F.interpolate(x, scale_factor=scale, mode=mode)`` of the global input (integer scales; an
    image's, a volume's or a sequence's).

    ``whole[a]``: ``tile`` holds every row of axis ``a`` (an input with fewer rows than tiles: deeplabv3's
    pooled 1×1 branch); each tile then reads its rows from it instead of exchanging halos.

    Raises:
        ValueError: A mode other than ``nearest`` or the (bi/tri)linear of the tile's rank
            (``align_corners=False``) on a split axis.
    """
    rank = len(grid.parts)
    scales = ntuple(tuple(scale), rank)
    if mode not in ("nearest", _LINEAR[rank]):
        raise ValueError(f"upsampling mode {mode!r} is not supported on spatial tiles; use nearest or {_LINEAR[rank]}")
    margin = 0 if mode == "nearest" else 1

    def reads(axis: int) -> Reads:
        s = scales[axis]
        return lambda o0, o1: (o0 // s - margin, (o1 - 1) // s + 1 + margin)

    outputs = tuple(extent * s for extent, s in zip(full_hw, scales))
    local, starts = _gather_reads(tile, grid, full_hw, outputs, tuple(reads(axis) for axis in range(rank)), whole)
    result = F.interpolate(local, scale_factor=scales, mode=mode, align_corners=None if mode == "nearest" else False)
    origins = tuple(start * s for start, s in zip(starts, scales))
    return _crop(result, grid, outputs, origins)


def conv_transpose2d(tile: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, grid: TileGrid,
                     full_hw: tuple[int, ...], stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                     output_padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1,
                     groups: int = 1) -> torch.Tensor:
    """This tile of ``F.conv_transpose2d`` of the global input (spatial extents ``full_hw``; a volume's
    ``F.conv_transpose3d``)."""
    rank = len(grid.parts)
    stride_, padding_, dilation_ = ntuple(stride, rank), ntuple(padding, rank), ntuple(dilation, rank)
    output_padding_ = ntuple(output_padding, rank)
    kernel = tuple(weight.shape[2:])
    outputs = tuple((extent - 1) * s - 2 * p + d * (k - 1) + op + 1 for extent, s, p, d, k, op
                    in zip(full_hw, stride_, padding_, dilation_, kernel, output_padding_))

    def reads(axis: int) -> Reads:
        s, p, reach = stride_[axis], padding_[axis], dilation_[axis] * (kernel[axis] - 1)
        return lambda o0, o1: (-(-(o0 + p - reach) // s), (o1 - 1 + p) // s + 1)

    local, starts = _gather_reads(tile, grid, full_hw, outputs, tuple(reads(axis) for axis in range(rank)))
    split = tuple(parts > 1 for parts in grid.parts)
    local_padding = tuple(0 if split[a] else padding_[a] for a in range(rank))
    local_output_padding = tuple(0 if split[a] else output_padding_[a] for a in range(rank))
    result = by_rank(CONV_TRANSPOSE, tile)(local, weight, None, stride_, local_padding, local_output_padding, groups,
                                           dilation_)
    origins = tuple(start * s - p for start, s, p in zip(starts, stride_, padding_))
    result = _crop(result, grid, outputs, origins)
    return result if bias is None else result + bias.view(1, -1, *([1] * rank))


def adaptive_avg_pool2d(tile: torch.Tensor, grid: TileGrid, full_hw: tuple[int, ...], output_hw: tuple[int, int],
                        whole: tuple[bool, ...] = (False, False)) -> torch.Tensor:
    """This tile of ``F.adaptive_avg_pool2d(x, output_hw)`` of the global input (spatial extent ``full_hw``;
    ``whole`` as :func:`interpolate`'s).

    Output row ``o`` averages input rows ``⌊o·I/O⌋ … ⌈(o+1)·I/O⌉ − 1`` (:func:`cost_models.halo.adaptive_reads`);
    the tile receives its windows' rows and averages them with one matrix per axis (windows may overlap when
    ``I`` is not a multiple of ``O``, or repeat rows when ``O > I``).
    """
    def reads(axis: int) -> Reads:
        return partial(adaptive_reads, full_hw[axis], output_hw[axis])

    local, starts = _gather_reads(tile, grid, full_hw, output_hw, (reads(0), reads(1)), whole)
    rows, cols = (_averaging(full_hw[a], output_hw[a], _own(output_hw[a], parts, grid.tile[a]), starts[a],
                             local.shape[2 + a], local) for a, parts in enumerate((grid.h, grid.w)))
    return torch.einsum("oh,nchw,pw->ncop", rows, local, cols)


def pad2d(tile: torch.Tensor, grid: TileGrid, full_hw: tuple[int, ...], pad: Sequence[int],
          value: float = 0.0) -> torch.Tensor:
    """This tile of ``F.pad(x, pad, value=value)`` (constant mode) of the global input: output row ``o`` is input
    row ``o − top``, or ``value`` where that row lies outside the input. ``pad`` is ``F.pad``'s: left, right, top,
    bottom, then the channels' and samples' (applied on the box as they are)."""
    amounts = list(pad) + [0] * max(0, 4 - len(pad))
    before, after = (amounts[2], amounts[0]), (amounts[3], amounts[1])
    outputs = tuple(extent + b + a for extent, b, a in zip(full_hw, before, after))

    def reads(axis: int) -> Reads:
        return lambda o0, o1: (o0 - before[axis], o1 - before[axis])

    local, starts = _gather_reads(tile, grid, full_hw, outputs, (reads(0), reads(1)))
    split = (grid.h > 1, grid.w > 1)
    here = [0 if split[1] else amounts[0], 0 if split[1] else amounts[1], 0 if split[0] else amounts[2],
            0 if split[0] else amounts[3], *amounts[4:]]
    result = F.pad(local, here, value=value)
    origins = tuple(start + b for start, b in zip(starts, before))
    return _crop(result, grid, outputs, origins, value)


def _own(extent: int, parts: int, tile: int) -> tuple[int, int]:
    return partition(extent, parts)[tile] if parts > 1 else (0, extent)


def _averaging(extent_in: int, extent_out: int, outputs: tuple[int, int], start: int, held: int,
               like: torch.Tensor) -> torch.Tensor:
    """``(o1 − o0) × held``: row ``o`` averages the held rows (global ``start …``) of output row ``o``'s window."""
    matrix = torch.zeros(outputs[1] - outputs[0], held, dtype=like.dtype, device=like.device)
    for row, o in enumerate(range(*outputs)):
        i0, i1 = adaptive_reads(extent_in, extent_out, o, o + 1)
        matrix[row, i0 - start:i1 - start] = 1.0 / (i1 - i0)
    return matrix


def _gather_reads(tile: torch.Tensor, grid: TileGrid, full_hw: tuple[int, ...], outputs: tuple[int, ...],
                  reads: tuple[Reads, ...],
                  whole: tuple[bool, ...] | None = None) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The tile extended by the rows its outputs read (clipped to the tensor), and the first row held per axis;
    along an axis ``whole`` holds entirely, the rows read are cut from it."""
    local, starts = tile, [0] * len(grid.parts)
    whole = whole or (False,) * len(grid.parts)
    for axis, parts in enumerate(grid.parts):
        if parts == 1:
            continue
        ranges = [_clip(reads[axis](o0, o1), full_hw[axis]) for o0, o1 in partition(outputs[axis], parts)]
        if whole[axis]:
            start, stop = ranges[grid.tile[axis]]
            local, starts[axis] = local.narrow(2 + axis, start, stop - start), start
            continue
        window = window_of_reads(full_hw[axis], ranges, grid.tile[axis], grid.neighbours(axis), "this upsampling")
        local = exchange_halo(local, 2 + axis, window)
        starts[axis] = window.read_start
    return local, tuple(starts)


def _crop(result: torch.Tensor, grid: TileGrid, outputs: tuple[int, ...], origins: tuple[int, ...],
          fill: float = 0.0) -> torch.Tensor:
    """Rows ``partition(outputs, parts)[tile]`` of ``result``, whose first row is global row ``origins`` (rows it
    does not hold are ``fill``)."""
    rank = len(grid.parts)
    for axis, parts in enumerate(grid.parts):
        if parts == 1:
            continue
        o0, o1 = partition(outputs[axis], parts)[grid.tile[axis]]
        dim, origin = 2 + axis, origins[axis]
        before, after = max(0, origin - o0), max(0, o1 - (origin + result.shape[dim]))
        pads = [0, 0] * rank  # rows no input reaches (a stride wider than the kernel, output padding)
        pads[2 * (rank - 1 - axis)], pads[2 * (rank - 1 - axis) + 1] = before, after
        result = F.pad(result, pads, value=fill)  # on every tile, even when zero: every rank's graph has one shape
        result = result.narrow(dim, o0 - origin + before, o1 - o0)
    return result


def _clip(rows: tuple[int, int], extent: int) -> tuple[int, int]:
    start, stop = max(rows[0], 0), min(rows[1], extent)
    if start >= stop:
        raise ValueError("a tile of this upsampling reads no input rows; use fewer tiles")
    return start, stop
