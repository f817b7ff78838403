"""Convolution and pooling on a tile of a height/width split, equal to the unsplit operation's tile.

A :class:`TileGrid` says how the spatial dimensions are split (``h × w``
tiles, row-major) and which global rank holds each tile. The functions take
this rank's tile of the input — rows ``partition(H, h)[i]``, columns
``partition(W, w)[j]`` — exchange halos with the neighbouring tiles
(``runtime.halo_exchange``) and return this rank's tile of the output; their
backward returns the tile's input gradient with the halo gradients added
back. Weight and bias gradients are this tile's share: summing them over
the tiles (and samples) gives the unsplit gradients.

Global padding is applied by the exchange on border tiles (zeros for
convolution and average pooling, ``-inf`` for max pooling), so the local
operation runs without padding along split axes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
from runtime.collectives import all_reduce_sum
import torch.nn.functional as F

from runtime.halo_exchange import AxisWindow, axis_window, exchange_halo
from runtime.overlap import bands_are_uniform, conv2d_overlapped

__all__ = ["TileGrid", "avg_pool2d", "conv2d", "global_avg_pool2d", "max_pool2d"]


@dataclass(frozen=True)
class TileGrid:
    """An ``h × w`` split of the spatial dimensions; ``ranks[i * w + j]`` holds tile ``(i, j)``."""

    h: int
    w: int
    ranks: tuple[int, ...]
    tile: tuple[int, int]

    def __post_init__(self) -> None:
        if len(self.ranks) != self.h * self.w:
            raise ValueError(f"a {self.h}×{self.w} grid needs {self.h * self.w} ranks, got {len(self.ranks)}")
        if not (0 <= self.tile[0] < self.h and 0 <= self.tile[1] < self.w):
            raise ValueError(f"tile {self.tile} is outside the {self.h}×{self.w} grid")

    @classmethod
    def of_rank(cls, h: int, w: int, ranks: Sequence[int], rank: int) -> "TileGrid":
        """The grid seen by ``rank`` (one of ``ranks``, row-major)."""
        index = list(ranks).index(rank)
        return cls(h, w, tuple(ranks), divmod(index, w))

    def neighbours(self, axis: int) -> tuple[int | None, int | None]:
        """Global ranks of the tiles before and after this one along ``axis`` (0: height, 1: width)."""
        i, j = self.tile
        if axis == 0:
            return (self.ranks[(i - 1) * self.w + j] if i > 0 else None,
                    self.ranks[(i + 1) * self.w + j] if i + 1 < self.h else None)
        return (self.ranks[i * self.w + j - 1] if j > 0 else None,
                self.ranks[i * self.w + j + 1] if j + 1 < self.w else None)


def conv2d(tile: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, grid: TileGrid,
           full_hw: tuple[int, int], stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
           dilation: int | Sequence[int] = 1, groups: int = 1, overlap: bool = True) -> torch.Tensor:
    """This tile of ``F.conv2d`` of the global input (spatial extent ``full_hw``).

    With ``overlap`` the tile's interior is convolved while the halos travel (``runtime.overlap``).
    """
    stride, padding, dilation = pair(stride), pair(padding), pair(dilation)
    kernel = tuple(weight.shape[2:])
    if overlap and grid.h * grid.w > 1:
        every = [[axis_window(full_hw[axis], parts, index, kernel[axis], stride[axis], dilation[axis], padding[axis],
                              grid.neighbours(axis)) for index in range(parts)] if parts > 1 else None
                 for axis, parts in enumerate((grid.h, grid.w))]
        windows = [tiles[grid.tile[axis]] if tiles is not None else None for axis, tiles in enumerate(every)]
        rows = [[w.own_stop - w.own_start for w in tiles] if tiles is not None else [full_hw[axis]]
                for axis, tiles in enumerate(every)]
        reach = (dilation[0] * (kernel[0] - 1), dilation[1] * (kernel[1] - 1))
        uniform = bands_are_uniform(every, rows, stride, reach, padding)
        return conv2d_overlapped(tile, weight, bias, windows, stride, padding, dilation, groups, uniform)
    local, local_padding = _with_halos(tile, grid, full_hw, kernel, stride, dilation, padding, 0.0)
    return F.conv2d(local, weight, bias, stride, local_padding, dilation, groups)


def max_pool2d(tile: torch.Tensor, grid: TileGrid, full_hw: tuple[int, int], kernel_size: int | Sequence[int],
               stride: int | Sequence[int] | None = None, padding: int | Sequence[int] = 0,
               dilation: int | Sequence[int] = 1, ceil_mode: bool = False) -> torch.Tensor:
    """This tile of ``F.max_pool2d`` of the global input.

    With ``ceil_mode`` every tile pools in ceil mode: a tile's windows but the global last fit its rows exactly
    (ceil and floor agree), and the last tile holds the rows up to the padding's end, as the whole does.
    """
    kernel = pair(kernel_size)
    stride_ = pair(stride) if stride is not None else kernel
    local, local_padding = _with_halos(tile, grid, full_hw, kernel, stride_, pair(dilation), pair(padding),
                                       float("-inf"), ceil_mode)
    return F.max_pool2d(local, kernel, stride_, local_padding, pair(dilation), ceil_mode=ceil_mode)


def avg_pool2d(tile: torch.Tensor, grid: TileGrid, full_hw: tuple[int, int], kernel_size: int | Sequence[int],
               stride: int | Sequence[int] | None = None, padding: int | Sequence[int] = 0,
               count_include_pad: bool = True, ceil_mode: bool = False) -> torch.Tensor:
    """This tile of ``F.avg_pool2d`` of the global input (``ceil_mode`` as :func:`max_pool2d`'s).

    The halos and the global padding (zeros) are put around the tile and the local windows average them.
    Without ``count_include_pad`` a window's divisor counts its input elements only: the same average of a
    mask of the tile's real rows (halos included, global padding not) divides it.
    """
    kernel = pair(kernel_size)
    stride_ = pair(stride) if stride is not None else kernel
    local, local_padding = _with_halos(tile, grid, full_hw, kernel, stride_, (1, 1), pair(padding), 0.0, ceil_mode)
    average = F.avg_pool2d(local, kernel, stride_, local_padding, ceil_mode=ceil_mode, count_include_pad=True)
    if count_include_pad:
        return average
    real = _real_positions(local, grid, full_hw, kernel, stride_, pair(padding), ceil_mode)
    return average / F.avg_pool2d(real, kernel, stride_, local_padding, ceil_mode=ceil_mode, count_include_pad=True)


def _real_positions(local: torch.Tensor, grid: TileGrid, full_hw: tuple[int, int], kernel: tuple[int, ...],
                    stride: tuple[int, int], padding: tuple[int, int], ceil_mode: bool) -> torch.Tensor:
    """A ``(1, 1, H, W)`` mask of ``local`` (a tile with its halos and global padding): 1 where it holds an input
    element, 0 in the global padding of a split axis."""
    masks = []
    for axis, parts in enumerate((grid.h, grid.w)):
        mask = torch.ones(local.shape[2 + axis], dtype=local.dtype, device=local.device)
        if parts > 1:
            window = axis_window(full_hw[axis], parts, grid.tile[axis], kernel[axis], stride[axis], 1, padding[axis],
                                 grid.neighbours(axis), ceil_mode)
            mask[:max(0, -window.read_start)] = 0
            mask[mask.numel() - max(0, window.read_stop - full_hw[axis]):] = 0
        masks.append(mask)
    return (masks[0][:, None] * masks[1][None, :])[None, None]


def global_avg_pool2d(tile: torch.Tensor, full_hw: tuple[int, int], group: Any = None) -> torch.Tensor:
    """``F.adaptive_avg_pool2d(x, 1)`` of the global input: tile sums added over the spatial ``group``.

    The result ``(N, C, 1, 1)`` is whole on every rank of the group. Backward
    adds the gradients of all those copies (``runtime.collectives.all_reduce_sum``),
    so when every rank goes on to compute the same loss from its copy, each
    rank must weigh its copy by ``1/len(group)`` to get the unsplit gradient.
    """
    summed = tile.sum(dim=(2, 3), keepdim=True)
    if dist.is_available() and dist.is_initialized():
        summed = all_reduce_sum(summed, group)
    return summed / (full_hw[0] * full_hw[1])


def _with_halos(tile: torch.Tensor, grid: TileGrid, full_hw: tuple[int, int], kernel: tuple[int, ...],
                stride: tuple[int, int], dilation: tuple[int, int], padding: tuple[int, int],
                fill: float, ceil_mode: bool = False) -> tuple[torch.Tensor, tuple[int, int]]:
    """The tile with its halos on every split axis, and the padding left for the local operation."""
    local, local_padding = tile, list(padding)
    for axis, parts in enumerate((grid.h, grid.w)):
        if parts == 1:
            continue
        window: AxisWindow = axis_window(full_hw[axis], parts, grid.tile[axis], kernel[axis], stride[axis],
                                         dilation[axis], padding[axis], grid.neighbours(axis), ceil_mode)
        local = exchange_halo(local, 2 + axis, window, fill)
        local_padding[axis] = 0
    return local, (local_padding[0], local_padding[1])


def pair(value: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    first, second = tuple(value)
    return int(first), int(second)
