"""Halo exchange along one axis of a spatially split tensor, as an autograd function.

A tile of a split axis owns the input rows ``partition(I, parts)[t]``
(balanced, as ``torch.tensor_split``) and produces the output rows
``partition(O, parts)[t]`` of a window operation (kernel ``k``, stride ``s``,
dilation ``d``, padding ``p``). Those output rows read the input rows
``[o0·s − p, (o1−1)·s − p + d·(k−1)]``: the tile receives the ones its
neighbours own (its *halo*), adds the global padding where the range leaves
the tensor (border tiles only), and drops own rows no window reads. The
result, fed to the same operation with no padding on this axis, gives exactly
the tile's output rows.

Backward sends the gradient of each received halo back to the neighbour that
owns those rows, which adds it to its own input gradient. A 2-D split runs
one exchange per axis — rows first, then columns of the row-extended tile — so
corners arrive with the second exchange, and backward undoes them in reverse.

Assumptions (checked): a halo never reaches past the adjacent tile (as
``cost_models.halo.axis_halos`` requires), and each tile's windows read at
least one row of its own or of an adjacent tile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from cost_models.halo import partition

__all__ = ["AxisWindow", "axis_window", "exchange_halo"]


@dataclass(frozen=True)
class AxisWindow:
    """What one tile reads along one axis: its own rows, the rows its outputs read, and its neighbours.

    ``read_start``/``read_stop`` may lie outside ``[0, extent)``: those rows are
    global padding. ``before``/``after`` are the global ranks of the tiles that
    own the rows just before and after this tile's (``None`` at the borders);
    ``sends_before``/``sends_after`` are the rows of this tile those neighbours read.
    """

    extent: int
    own_start: int
    own_stop: int
    read_start: int
    read_stop: int
    before: int | None
    after: int | None
    sends_before: tuple[int, int]
    sends_after: tuple[int, int]


def axis_window(extent: int, parts: int, tile: int, kernel: int, stride: int, dilation: int, padding: int,
                neighbours: tuple[int | None, int | None]) -> AxisWindow:
    """The :class:`AxisWindow` of ``tile`` of ``parts`` along an axis of ``extent`` input rows.

    Raises:
        ValueError: The split is too fine for the window (a halo beyond the adjacent tile).
    """
    extent_out = (extent + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    owned, produced = partition(extent, parts), partition(extent_out, parts)
    reads = [_read_range(o0, o1, kernel, stride, dilation, padding) for o0, o1 in produced]
    for index, (start, stop) in enumerate(reads):
        low = owned[index - 1][0] if index > 0 else 0
        high = owned[index + 1][1] if index + 1 < parts else extent
        if max(start, 0) < low or min(stop, extent) > high:
            raise ValueError(f"a {parts}-way split of {extent} rows is too fine for a window of {kernel} (stride "
                             f"{stride}, dilation {dilation}): tile {index} reads beyond its neighbours")
    own_start, own_stop = owned[tile]
    sends_before = _overlap(reads[tile - 1], owned[tile]) if tile > 0 else (own_start, own_start)
    sends_after = _overlap(reads[tile + 1], owned[tile]) if tile + 1 < parts else (own_stop, own_stop)
    return AxisWindow(extent, own_start, own_stop, reads[tile][0], reads[tile][1], neighbours[0], neighbours[1],
                      sends_before, sends_after)


def exchange_halo(tile: torch.Tensor, dim: int, window: AxisWindow, fill: float = 0.0) -> torch.Tensor:
    """The rows ``[read_start, read_stop)`` of the global tensor along ``dim``, for this tile (differentiable).

    Every tile of the axis must call this at the same point (it sends and receives).
    """
    return _HaloExchange.apply(tile, dim, window, fill)


class _HaloExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tile: torch.Tensor, dim: int, window: AxisWindow, fill: float) -> torch.Tensor:
        ctx.dim, ctx.window = dim, window
        w = window
        first, last = max(w.read_start, 0), min(w.read_stop, w.extent)
        received_before = (first, min(w.own_start, last)) if first < w.own_start else (first, first)
        received_after = (max(w.own_stop, first), last) if last > w.own_stop else (last, last)
        ctx.received = (received_before, received_after)
        outgoing = [(w.before, _rows(tile, dim, w.sends_before, w.own_start)),
                    (w.after, _rows(tile, dim, w.sends_after, w.own_start))]
        incoming = [(w.before, _empty_rows(tile, dim, received_before)), (w.after, _empty_rows(tile, dim, received_after))]
        _swap(outgoing, incoming)
        kept = _rows(tile, dim, (max(first, w.own_start), min(last, w.own_stop)), w.own_start)
        pads = (_filled(tile, dim, max(0, -w.read_start), fill), _filled(tile, dim, max(0, w.read_stop - w.extent), fill))
        return torch.cat([pads[0], incoming[0][1], kept, incoming[1][1], pads[1]], dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        w, dim = ctx.window, ctx.dim
        (before_start, before_stop), (after_start, after_stop) = ctx.received
        offset = max(0, -w.read_start)  # global padding rows at the start of the local tensor
        sizes = [offset, before_stop - before_start, 0, after_stop - after_start]
        first, last = max(w.read_start, 0), min(w.read_stop, w.extent)
        sizes[2] = max(0, min(last, w.own_stop) - max(first, w.own_start))
        parts = torch.split(grad, [*sizes, grad.shape[dim] - sum(sizes)], dim=dim)
        shape = list(grad.shape)
        shape[dim] = w.own_stop - w.own_start
        result = grad.new_zeros(shape)
        if sizes[2]:
            result.narrow(dim, max(first, w.own_start) - w.own_start, sizes[2]).add_(parts[2])
        outgoing = [(w.before, parts[1].contiguous()), (w.after, parts[3].contiguous())]
        incoming = [(w.before, _empty_rows(result, dim, w.sends_before)), (w.after, _empty_rows(result, dim, w.sends_after))]
        _swap(outgoing, incoming)
        for (start, stop), (_, rows) in zip((w.sends_before, w.sends_after), incoming):
            result.narrow(dim, start - w.own_start, stop - start).add_(rows)
        return result, None, None, None


def _read_range(o0: int, o1: int, kernel: int, stride: int, dilation: int, padding: int) -> tuple[int, int]:
    return o0 * stride - padding, (o1 - 1) * stride - padding + dilation * (kernel - 1) + 1


def _overlap(read: tuple[int, int], owned: tuple[int, int]) -> tuple[int, int]:
    start, stop = max(read[0], owned[0]), min(read[1], owned[1])
    return (start, stop) if start < stop else (owned[0], owned[0])


def _rows(tensor: torch.Tensor, dim: int, span: tuple[int, int], origin: int) -> torch.Tensor:
    return tensor.narrow(dim, span[0] - origin, max(0, span[1] - span[0])).contiguous()


def _empty_rows(like: torch.Tensor, dim: int, span: tuple[int, int]) -> torch.Tensor:
    shape = list(like.shape)
    shape[dim] = max(0, span[1] - span[0])
    return like.new_empty(shape)


def _filled(like: torch.Tensor, dim: int, rows: int, fill: float) -> torch.Tensor:
    shape = list(like.shape)
    shape[dim] = rows
    return like.new_full(shape, fill)


def _swap(outgoing: list[tuple[int | None, torch.Tensor]], incoming: list[tuple[int | None, torch.Tensor]]) -> None:
    """Post every non-empty send and receive at once (non-blocking), then wait for all of them."""
    requests = [dist.isend(rows, peer) for peer, rows in outgoing if peer is not None and rows.numel()]
    requests += [dist.irecv(rows, peer) for peer, rows in incoming if peer is not None and rows.numel()]
    for request in requests:
        request.wait()
