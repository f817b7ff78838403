"""Padding modes on a tile: convolution and ``F.pad`` with reflect, replicate or circular padding (and asymmetric
zero padding, an even kernel's ``'same'``), equal to the unsplit operation's tile.

``cost_models.borders`` says which input row each padded row of a tile's window
reads. A tile gathers those rows along each split axis — its own, its
neighbours' (the first and last tiles' from each other under ``circular``), or
the fill value — with one point-to-point exchange per axis
(:func:`gather_axis`), rows first, then the columns of the row-extended tile
(the modes are separable). Unsplit axes are padded locally with the same mode.
The local operation then runs without padding.

Backward is the adjoint: the gradient of every gathered row goes back to the
tile that owns the row and is added to its input gradient (a row read twice —
a reflection next to itself — gets both).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F

from cost_models.borders import owner_of, source_row, window_reads
from cost_models.halo import partition
from runtime.spatial import CONV, TileGrid, by_rank, ntuple
from runtime.waiting import exchange, in_backward, place

__all__ = ["AxisGather", "axis_gather", "gather_axis", "padded_conv2d", "padded_pad2d"]

Pads = tuple[tuple[int, int], ...]  # per spatial axis (before, after): ((top, bottom), (left, right)) of an image


@dataclass(frozen=True)
class AxisGather:
    """How one tile of an axis gathers its padded reads: per peer, the rows (global, sorted) it receives and
    sends; per position, where the row comes from (``index`` into ``[own rows, received rows…, fill]``)."""

    dim: int
    peers: tuple[int, ...]
    receives: tuple[tuple[int, ...], ...]
    sends: tuple[tuple[int, ...], ...]
    own_start: int
    index: tuple[int, ...]
    fills: bool


@lru_cache(maxsize=1024)
def axis_gather(extent: int, reads: tuple[tuple[int, int], ...], tile: int, ranks: tuple[int, ...], mode: str,
                dim: int) -> AxisGather:
    """The :class:`AxisGather` of ``tile`` when tile ``t`` (global rank ``ranks[t]``) reads padded rows ``reads[t]``."""
    owned = partition(extent, len(reads))
    foreign = [_foreign(extent, span, owned, t, mode) for t, span in enumerate(reads)]
    peers = sorted({owner_of(row, owned) for row in foreign[tile]} | {t for t in range(len(reads)) if t != tile and any(
        owner_of(row, owned) == tile for row in foreign[t])})
    receives = [tuple(sorted({row for row in foreign[tile] if owner_of(row, owned) == p})) for p in peers]
    sends = [tuple(sorted({row for row in foreign[p] if owner_of(row, owned) == tile})) for p in peers]
    own_start, own_stop = owned[tile]
    offset, where = own_stop - own_start, {}
    for rows in receives:
        where.update({row: offset + k for k, row in enumerate(rows)})
        offset += len(rows)
    index, fills = [], False
    for position in range(*reads[tile]):
        row = source_row(position, extent, mode)
        fills |= row is None
        index.append(offset if row is None else row - own_start if own_start <= row < own_stop else where[row])
    return AxisGather(dim, tuple(ranks[p] for p in peers), tuple(receives), tuple(sends), own_start, tuple(index),
                      fills)


def _foreign(extent: int, span: tuple[int, int], owned: Sequence[tuple[int, int]], tile: int, mode: str) -> list[int]:
    """The input rows tile ``tile`` reads (padded rows ``span``) that another tile owns."""
    start, stop = span
    own_start, own_stop = owned[tile]
    positions = [*range(start, min(stop, own_start)), *range(max(start, own_stop), stop)]
    rows = (source_row(p, extent, mode) for p in positions)
    return [row for row in rows if row is not None and not own_start <= row < own_stop]


def gather_axis(tile: torch.Tensor, gather: AxisGather, fill: float = 0.0) -> torch.Tensor:
    """The tile's padded reads along ``gather.dim`` (differentiable). Every tile of the axis calls this together."""
    received = _Exchange.apply(tile, gather) if gather.peers else ()
    pieces = [tile, *received]
    if gather.fills:
        shape = list(tile.shape)
        shape[gather.dim] = 1
        pieces.append(tile.new_full(shape, fill))
    joined = torch.cat(pieces, dim=gather.dim) if len(pieces) > 1 else tile
    return joined.index_select(gather.dim, _index(gather.index, tile.device))


@lru_cache(maxsize=1024)
def _index(positions: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The gather's positions as a tensor on ``device``, made once per tile and device (every step reuses it)."""
    return torch.tensor(positions, dtype=torch.long, device=device)


class _ExchangeContext(Protocol):
    gather: AxisGather
    shape: tuple[int, ...]
    where: tuple[str, ...]


class _Exchange(torch.autograd.Function):
    """Forward: send the rows peers read, receive the rows this tile reads. Backward: the adjoint."""

    @staticmethod
    def forward(ctx: _ExchangeContext, tile: torch.Tensor, gather: AxisGather) -> tuple[torch.Tensor, ...]:
        ctx.gather, ctx.shape, ctx.where = gather, tuple(tile.shape), place()
        outgoing = [tile.index_select(gather.dim, _local(rows, gather, tile.device)).contiguous()
                    for rows in gather.sends]
        incoming = [_rows_like(tile, gather.dim, len(rows)) for rows in gather.receives]
        _swap(gather.peers, outgoing, incoming, "the padding exchange", ctx.where)
        return tuple(incoming)

    @staticmethod
    def backward(ctx: _ExchangeContext, *grads: torch.Tensor | None) -> tuple[torch.Tensor, None]:
        gather = ctx.gather
        like = next(g for g in grads if g is not None)
        outgoing = [(g if g is not None else _rows_like(like, gather.dim, len(rows)).zero_()).contiguous()
                    for g, rows in zip(grads, gather.receives)]
        result = like.new_zeros(ctx.shape)
        incoming = [_rows_like(result, gather.dim, len(rows)) for rows in gather.sends]
        _swap(gather.peers, outgoing, incoming, "the padding exchange", in_backward(ctx.where))
        for rows, block in zip(gather.sends, incoming):
            result.index_add_(gather.dim, _local(rows, gather, result.device), block)
        return result, None


def _swap(peers: Sequence[int], outgoing: Sequence[torch.Tensor], incoming: Sequence[torch.Tensor], what: str,
          where: Sequence[str]) -> None:
    with exchange(what, peers, where):
        requests = [dist.isend(rows, peer) for peer, rows in zip(peers, outgoing) if rows.numel()]
        requests += [dist.irecv(rows, peer) for peer, rows in zip(peers, incoming) if rows.numel()]
        for request in requests:
            assert request is not None  # None only to a rank outside the default group
            request.wait()


def _local(rows: Sequence[int], gather: AxisGather, device: torch.device) -> torch.Tensor:
    return torch.tensor([row - gather.own_start for row in rows], dtype=torch.long, device=device)


def _rows_like(like: torch.Tensor, dim: int, rows: int) -> torch.Tensor:
    shape = list(like.shape)
    shape[dim] = rows
    return like.new_empty(shape)


def padded_tiles(tile: torch.Tensor, grid: TileGrid, full_hw: tuple[int, ...], pads: Pads, mode: str,
                 windows: Sequence[tuple[int, int, int]], fill: float = 0.0) -> torch.Tensor:
    """The tile extended by its windows' padded reads on each split axis, padded locally on the others (an
    image's or a volume's).

    ``windows[axis]`` is ``(kernel, stride, dilation)``; ``pads[axis]`` the padding before and after.
    """
    local = tile
    for axis, parts in enumerate(grid.parts):
        if parts == 1:
            continue
        ranks = grid.axis_ranks(axis)
        reads = tuple(window_reads(full_hw[axis], parts, *windows[axis], pads[axis]))
        local = gather_axis(local, axis_gather(full_hw[axis], reads, grid.tile[axis], ranks, mode, 2 + axis), fill)
    here = [amount for axis in reversed(range(len(grid.parts)))
            for amount in (pads[axis] if grid.parts[axis] == 1 else (0, 0))]
    if not any(here):
        return local
    if mode in ("zeros", "constant"):
        return F.pad(local, here, value=fill)
    return F.pad(local, here, mode=mode)


def padded_conv2d(tile: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, grid: TileGrid,
                  full_hw: tuple[int, ...], stride: int | Sequence[int], pads: Pads, dilation: int | Sequence[int],
                  groups: int, mode: str) -> torch.Tensor:
    """This tile of a convolution padded by ``pads`` in ``mode`` (``nn.Conv2d``'s ``padding_mode``, or ``zeros``; a
    volume's ``nn.Conv3d``)."""
    rank = len(grid.parts)
    stride, dilation = ntuple(stride, rank), ntuple(dilation, rank)
    windows = [(int(weight.shape[2 + axis]), stride[axis], dilation[axis]) for axis in range(rank)]
    local = padded_tiles(tile, grid, full_hw, pads, mode, windows)
    return by_rank(CONV, tile)(local, weight, bias, stride, 0, dilation, groups)


def padded_pad2d(tile: torch.Tensor, grid: TileGrid, full_hw: tuple[int, ...], pad: Sequence[int],
                 mode: str) -> torch.Tensor:
    """This tile of ``F.pad(x, pad, mode=mode)`` (reflect, replicate or circular) of the global input."""
    amounts = [*pad, 0, 0, 0, 0][:4]
    pads = ((amounts[2], amounts[3]), (amounts[0], amounts[1]))
    return padded_tiles(tile, grid, full_hw, pads, mode, [(1, 1, 1), (1, 1, 1)])
