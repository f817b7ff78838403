"""Convolution and pooling on a tile of a spatial split, equal to the unsplit operation's tile.

A :class:`TileGrid` says how the spatial dimensions are split (``h × w``
tiles of an image, ``d × h × w`` of a volume, ``w`` of a sequence; row-major)
and which global rank holds each tile. The functions take this rank's tile of
the input — rows ``partition(H, h)[i]``, columns ``partition(W, w)[j]`` (and
slices ``partition(D, d)[k]``) — exchange halos with the neighbouring tiles
(``runtime.halo_exchange``, one axis after the other, so edges and corners
arrive with the later axes) and return this rank's tile of the output; their
backward returns the tile's input gradient with the halo gradients added
back. Each works on tensors of the grid's rank: the ``2d`` in a name is the
image form, and a volume's (a sequence's) tile runs the 3-D (1-D) operation.
Weight and bias gradients are this tile's share: summing them over
the tiles (and samples) gives the unsplit gradients.

Global padding is applied by the exchange on border tiles (zeros for
convolution and average pooling, ``-inf`` for max pooling), so the local
operation runs without padding along split axes. A convolution meets its
halos in one of three forms (:data:`ConvForm`, chosen by :func:`conv_form`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F

from cost_models.halo import partition, window_output_extent
from runtime.collectives import all_reduce_sum
from runtime.halo_exchange import AxisWindow, axis_window, exchange_halo
from runtime.overlap import bands_are_uniform, conv2d_overlapped
from runtime.superposed import Superposition, conv_superposed, superposable, superposition

__all__ = ["AVG_POOL", "CONV", "MAX_POOL", "ConvForm", "TileGrid", "avg_pool2d", "by_rank", "conv2d", "conv_form",
           "global_avg_pool2d", "max_pool2d", "ntuple", "pair"]


@dataclass(frozen=True)
class TileGrid:
    """A split of the spatial axes into ``parts`` (one count per axis: ``(h, w)`` of an image, ``(d, h, w)`` of a
    volume, ``(w,)`` of a sequence), tiles numbered row-major: ``ranks[index]`` holds tile ``tile``."""

    parts: tuple[int, ...]
    ranks: tuple[int, ...]
    tile: tuple[int, ...]

    def __post_init__(self) -> None:
        grid = "×".join(map(str, self.parts))
        if len(self.ranks) != prod(self.parts):
            raise ValueError(f"a {grid} grid needs {prod(self.parts)} ranks, got {len(self.ranks)}")
        if len(self.tile) != len(self.parts) or not all(0 <= t < p for t, p in zip(self.tile, self.parts)):
            raise ValueError(f"tile {self.tile} is outside the {grid} grid")

    @classmethod
    def of_rank(cls, parts: Sequence[int], ranks: Sequence[int], rank: int) -> TileGrid:
        """The grid seen by ``rank`` (one of ``ranks``, row-major)."""
        index, tile = list(ranks).index(rank), []
        for count in reversed(tuple(parts)):
            index, position = divmod(index, count)
            tile.append(position)
        return cls(tuple(parts), tuple(ranks), tuple(reversed(tile)))

    @property
    def h(self) -> int:
        """Tiles along the height (the image form's first axis)."""
        return self.parts[-2] if len(self.parts) > 1 else 1

    @property
    def w(self) -> int:
        """Tiles along the width (every grid's last axis)."""
        return self.parts[-1]

    def axis_ranks(self, axis: int) -> tuple[int, ...]:
        """Global ranks of the tiles in this tile's line along ``axis``, first to last."""
        stride = prod(self.parts[axis + 1:])
        base = self._index() - self.tile[axis] * stride
        return tuple(self.ranks[base + position * stride] for position in range(self.parts[axis]))

    def neighbours(self, axis: int) -> tuple[int | None, int | None]:
        """Global ranks of the tiles before and after this one along ``axis`` (``None`` at the borders)."""
        line, position = self.axis_ranks(axis), self.tile[axis]
        return (line[position - 1] if position > 0 else None,
                line[position + 1] if position + 1 < len(line) else None)

    def _index(self) -> int:
        index = 0
        for count, position in zip(self.parts, self.tile):
            index = index * count + position
        return index


def by_rank(operations: Mapping[int, Callable[..., torch.Tensor]], tensor: torch.Tensor) -> Callable[..., torch.Tensor]:
    """The operation of ``operations`` (keyed by tensor rank: 3, 4, 5) that ``tensor``'s rank takes."""
    if tensor.dim() not in operations:
        raise ValueError(f"a {tensor.dim()}-D tile has no spatial operation here; tiles are 3-D, 4-D or 5-D")
    return operations[tensor.dim()]


CONV = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}
MAX_POOL = {3: F.max_pool1d, 4: F.max_pool2d, 5: F.max_pool3d}
AVG_POOL = {3: F.avg_pool1d, 4: F.avg_pool2d, 5: F.avg_pool3d}


SUPERPOSED_TILE_PER_WEIGHT = 4
"""How many times a tile's values must outnumber its convolution's filter values for the superposed form on CPU
(:func:`conv_form`)."""

ConvForm = Literal["joined", "bands", "superposed"]
"""How a tile's convolution meets its halos: ``joined`` (one kernel call over the tile joined with its halos, a
copy of the tile), ``bands`` (the interior while the halos travel, then up to four border bands:
``runtime.overlap``), ``superposed`` (one kernel call over the bare tile while the halos travel, their share
added after: ``runtime.superposed``; one split axis)."""


def conv2d(tile: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, grid: TileGrid,
           full_hw: tuple[int, ...], stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
           dilation: int | Sequence[int] = 1, groups: int = 1, form: ConvForm | None = None) -> torch.Tensor:
    """This tile of ``F.conv2d`` of the global input (spatial extents ``full_hw``; a volume's ``F.conv3d``).

    ``form`` (:data:`ConvForm`; default :func:`conv_form`) says how the halos are met; a form a tile cannot take
    falls back to ``joined``.
    """
    rank = len(grid.parts)
    stride, padding, dilation = ntuple(stride, rank), ntuple(padding, rank), ntuple(dilation, rank)
    kernel = tuple(weight.shape[2:])
    form = form or conv_form(tile, weight, grid, full_hw, stride, padding, dilation)
    split = [axis for axis, parts in enumerate(grid.parts) if parts > 1]
    if form == "superposed" and len(split) == 1:
        plan = _superposition(grid, split[0], full_hw, kernel, stride, padding, dilation, groups)
        if plan is not None:
            return conv_superposed(by_rank(CONV, tile), tile, weight, bias, plan)
    if form == "bands" and rank == 2 and split:
        every = [[axis_window(full_hw[axis], parts, index, kernel[axis], stride[axis], dilation[axis], padding[axis],
                              grid.neighbours(axis)) for index in range(parts)] if parts > 1 else None
                 for axis, parts in enumerate((grid.h, grid.w))]
        windows = [tiles[grid.tile[axis]] if tiles is not None else None for axis, tiles in enumerate(every)]
        rows = [[w.own_stop - w.own_start for w in tiles] if tiles is not None else [full_hw[axis]]
                for axis, tiles in enumerate(every)]
        reach = (dilation[0] * (kernel[0] - 1), dilation[1] * (kernel[1] - 1))
        stride2, padding2, dilation2 = (stride[0], stride[1]), (padding[0], padding[1]), (dilation[0], dilation[1])
        uniform = bands_are_uniform(every, rows, stride2, reach, padding2)
        return conv2d_overlapped(tile, weight, bias, windows, stride2, padding2, dilation2, groups, uniform)
    local, local_padding = _with_halos(tile, grid, full_hw, kernel, stride, dilation, padding, 0.0)
    return by_rank(CONV, tile)(local, weight, bias, stride, local_padding, dilation, groups)


def conv_form(tile: torch.Tensor, weight: torch.Tensor, grid: TileGrid, full_hw: tuple[int, ...],
              stride: tuple[int, ...], padding: tuple[int, ...], dilation: tuple[int, ...]) -> ConvForm:
    """The form a convolution takes by default, the same on every tile of the grid (their exchanges pair up).

    On CPU: ``superposed`` where the grid splits one axis of an image, every tile of it can take the form and
    the tile outweighs the filters :data:`SUPERPOSED_TILE_PER_WEIGHT` times; else ``joined`` (volumes too:
    ``examples/unet3d.py`` at 4×1×48³ under ``d2`` took 674 ms a step superposed against 589 ms joined). Each
    band is one more kernel call over the whole filter bank, which the join's copy of the tile outweighs only
    on large tiles:
    resnet18 8×3×256² under ``h2`` (2 ranks of the 2-core development machine) took 968 ms a step with every
    convolution superposed against 908 ms joined (its convolution kernels +15 %: the last stages' tiles are 4
    and 8 rows under 512 and 256 filters), and the same within noise under this rule; the UNet at 2×3×512²
    peaked at 429 MB of tensors against 491 MB joined (no joined copy kept for backward). On CUDA: ``bands``
    of an image, as measured there (the superposed form is not yet measured on a GPU).
    """
    if tile.is_cuda:
        return "bands" if len(grid.parts) == 2 else "joined"
    split = [axis for axis, parts in enumerate(grid.parts) if parts > 1]
    if len(split) != 1 or len(grid.parts) != 2:
        return "joined"
    axis, kernel = split[0], tuple(weight.shape[2:])
    smallest = tile.numel() // max(1, tile.shape[2 + axis]) * (full_hw[axis] // grid.parts[axis])  # any tile's
    heavy = smallest >= SUPERPOSED_TILE_PER_WEIGHT * weight.numel()
    superposable = _every_tile_superposable(grid, axis, full_hw, kernel, stride, padding, dilation)
    return "superposed" if heavy and superposable else "joined"


@functools.cache  # per layer, not per step: the same arguments every step
def _every_tile_superposable(grid: TileGrid, axis: int, full_hw: tuple[int, ...], kernel: tuple[int, ...],
                             stride: tuple[int, ...], padding: tuple[int, ...], dilation: tuple[int, ...]) -> bool:
    parts, extent = grid.parts[axis], full_hw[axis]
    outputs = partition(window_output_extent(extent, kernel[axis], stride[axis], dilation[axis], padding[axis]),
                        parts)
    try:
        windows = [axis_window(extent, parts, index, kernel[axis], stride[axis], dilation[axis], padding[axis],
                               (None, None)) for index in range(parts)]
    except ValueError:
        return False  # too fine a split: the joined form says so
    return all(superposable(window, span, kernel[axis], stride[axis], padding[axis], dilation[axis])
               for window, span in zip(windows, outputs))


@functools.cache
def _superposition(grid: TileGrid, axis: int, full_hw: tuple[int, ...], kernel: tuple[int, ...],
                   stride: tuple[int, ...], padding: tuple[int, ...], dilation: tuple[int, ...],
                   groups: int) -> Superposition | None:
    """This tile's superposition along ``axis``, or ``None`` when a tile of the axis cannot take the form."""
    if not _every_tile_superposable(grid, axis, full_hw, kernel, stride, padding, dilation):
        return None
    window = axis_window(full_hw[axis], grid.parts[axis], grid.tile[axis], kernel[axis], stride[axis],
                         dilation[axis], padding[axis], grid.neighbours(axis))
    return superposition(window, axis, kernel[axis], stride, padding, dilation, groups)


def max_pool2d(tile: torch.Tensor, grid: TileGrid, full_hw: tuple[int, ...], kernel_size: int | Sequence[int],
               stride: int | Sequence[int] | None = None, padding: int | Sequence[int] = 0,
               dilation: int | Sequence[int] = 1, ceil_mode: bool = False) -> torch.Tensor:
    """This tile of ``F.max_pool2d`` of the global input.

    With ``ceil_mode`` every tile pools in ceil mode: a tile's windows but the global last fit its rows exactly
    (ceil and floor agree), and the last tile holds the rows up to the padding's end, as the whole does.
    """
    rank = len(grid.parts)
    kernel = ntuple(kernel_size, rank)
    stride_ = ntuple(stride, rank) if stride is not None else kernel
    local, local_padding = _with_halos(tile, grid, full_hw, kernel, stride_, ntuple(dilation, rank),
                                       ntuple(padding, rank), float("-inf"), ceil_mode)
    return by_rank(MAX_POOL, tile)(local, kernel, stride_, local_padding, ntuple(dilation, rank), ceil_mode=ceil_mode)


def avg_pool2d(tile: torch.Tensor, grid: TileGrid, full_hw: tuple[int, ...], kernel_size: int | Sequence[int],
               stride: int | Sequence[int] | None = None, padding: int | Sequence[int] = 0,
               count_include_pad: bool = True, ceil_mode: bool = False) -> torch.Tensor:
    """This tile of ``F.avg_pool2d`` of the global input (``ceil_mode`` as :func:`max_pool2d`'s).

    The halos and the global padding (zeros) are put around the tile and the local windows average them.
    Without ``count_include_pad`` a window's divisor counts its input elements only: the same average of a
    mask of the tile's real rows (halos included, global padding not) divides it.
    """
    rank = len(grid.parts)
    kernel = ntuple(kernel_size, rank)
    stride_ = ntuple(stride, rank) if stride is not None else kernel
    local, local_padding = _with_halos(tile, grid, full_hw, kernel, stride_, (1,) * rank, ntuple(padding, rank), 0.0,
                                       ceil_mode)
    pool = by_rank(AVG_POOL, tile)
    average = pool(local, kernel, stride_, local_padding, ceil_mode=ceil_mode, count_include_pad=True)
    if count_include_pad:
        return average
    real = _real_positions(local, grid, full_hw, kernel, stride_, ntuple(padding, rank), ceil_mode)
    return average / pool(real, kernel, stride_, local_padding, ceil_mode=ceil_mode, count_include_pad=True)


def _real_positions(local: torch.Tensor, grid: TileGrid, full_hw: tuple[int, ...], kernel: tuple[int, ...],
                    stride: tuple[int, ...], padding: tuple[int, ...], ceil_mode: bool) -> torch.Tensor:
    """A ``(1, 1, H, W)`` mask (``(1, 1, D, H, W)`` of a volume) of ``local`` (a tile with its halos and global
    padding): 1 where it holds an input element, 0 in the global padding of a split axis."""
    mask = local.new_ones((1, 1, *local.shape[2:]))
    for axis, parts in enumerate(grid.parts):
        if parts > 1:
            window = axis_window(full_hw[axis], parts, grid.tile[axis], kernel[axis], stride[axis], 1, padding[axis],
                                 grid.neighbours(axis), ceil_mode)
            mask.narrow(2 + axis, 0, max(0, -window.read_start)).zero_()
            after = max(0, window.read_stop - full_hw[axis])
            mask.narrow(2 + axis, mask.shape[2 + axis] - after, after).zero_()
    return mask


def global_avg_pool2d(tile: torch.Tensor, full_hw: tuple[int, ...],
                      group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``F.adaptive_avg_pool2d(x, 1)`` of the global input (``F.adaptive_avg_pool3d`` of a volume): tile sums added
    over the spatial ``group``.

    The result ``(N, C, 1, 1)`` (``(N, C, 1, 1, 1)``) is whole on every rank of the group. Backward
    adds the gradients of all those copies (``runtime.collectives.all_reduce_sum``),
    so when every rank goes on to compute the same loss from its copy, each
    rank must weigh its copy by ``1/len(group)`` to get the unsplit gradient.
    """
    summed = tile.sum(dim=tuple(range(2, tile.dim())), keepdim=True)
    if dist.is_available() and dist.is_initialized():
        summed = all_reduce_sum(summed, group)
    return summed / prod(full_hw)


def _with_halos(tile: torch.Tensor, grid: TileGrid, full_hw: tuple[int, ...], kernel: tuple[int, ...],
                stride: tuple[int, ...], dilation: tuple[int, ...], padding: tuple[int, ...],
                fill: float, ceil_mode: bool = False) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The tile with its halos on every split axis, and the padding left for the local operation."""
    local, local_padding = tile, list(padding)
    for axis, parts in enumerate(grid.parts):
        if parts == 1:
            continue
        window: AxisWindow = axis_window(full_hw[axis], parts, grid.tile[axis], kernel[axis], stride[axis],
                                         dilation[axis], padding[axis], grid.neighbours(axis), ceil_mode)
        local = exchange_halo(local, 2 + axis, window, fill)
        local_padding[axis] = 0
    return local, tuple(local_padding)


def ntuple(value: int | Sequence[int], rank: int) -> tuple[int, ...]:
    """``value`` for each of ``rank`` axes (an int repeated, or a sequence of that length)."""
    if isinstance(value, int):
        return (value,) * rank
    values = tuple(int(v) for v in value)
    if len(values) != rank:
        raise ValueError(f"{values} gives {len(values)} values for {rank} spatial axes")
    return values


def pair(value: int | Sequence[int]) -> tuple[int, int]:
    first, second = ntuple(value, 2)
    return first, second
