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
owns those rows, which adds it to its own input gradient. The exchange is two
autograd functions, :func:`start_halo` (post the non-blocking sends and
receives) and :func:`finish_halo` (wait and join), so a caller can compute
what needs no halo in between (``runtime.overlap``). A 2-D split runs
one exchange per axis — rows first, then columns of the row-extended tile — so
corners arrive with the second exchange, and backward undoes them in reverse.

Assumptions (checked): a halo never reaches past the adjacent tile (as
``cost_models.halo.axis_halos`` requires), and each tile's windows read at
least one row of its own or of an adjacent tile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from cost_models.halo import partition, window_output_extent
from runtime.waiting import exchange, in_backward, place, wait_all

__all__ = ["AxisWindow", "PendingHalo", "axis_window", "empty_rows", "exchange_halo", "exchange_name", "finish_halo",
           "halo_messages", "peers_of", "post_messages", "received_ranges", "start_halo", "window_of_reads"]


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
                neighbours: tuple[int | None, int | None], ceil_mode: bool = False) -> AxisWindow:
    """The :class:`AxisWindow` of ``tile`` of ``parts`` along an axis of ``extent`` input rows (``ceil_mode``:
    pooling's, whose last window may overhang the right padding: it reads up to the padding's end).

    Raises:
        ValueError: The split is too fine for the window (a halo beyond the adjacent tile).
    """
    extent_out = window_output_extent(extent, kernel, stride, dilation, padding, ceil_mode)
    reads = [_read_range(o0, o1, kernel, stride, dilation, padding) for o0, o1 in partition(extent_out, parts)]
    reads = [(start, min(stop, extent + padding)) for start, stop in reads]
    return window_of_reads(extent, reads, tile, neighbours,
                           f"a window of {kernel} (stride {stride}, dilation {dilation})")


def window_of_reads(extent: int, reads: list[tuple[int, int]], tile: int,
                    neighbours: tuple[int | None, int | None], what: str = "this operation") -> AxisWindow:
    """The :class:`AxisWindow` of ``tile`` when tile ``t`` reads the input rows ``reads[t]`` (global indices).

    Rows outside ``[0, extent)`` are global padding. Used directly by operations
    that are not sliding windows (upsampling, transposed convolution).

    Raises:
        ValueError: A tile reads beyond its adjacent tiles (the split is too fine for ``what``).
    """
    parts = len(reads)
    owned = partition(extent, parts)
    for index, (start, stop) in enumerate(reads):
        low = owned[index - 1][0] if index > 0 else 0
        high = owned[index + 1][1] if index + 1 < parts else extent
        if max(start, 0) < low or min(stop, extent) > high:
            raise ValueError(f"a {parts}-way split of {extent} rows is too fine for {what}: tile {index} reads "
                             f"beyond its neighbours")
    own_start, own_stop = owned[tile]
    sends_before = _overlap(reads[tile - 1], owned[tile]) if tile > 0 else (own_start, own_start)
    sends_after = _overlap(reads[tile + 1], owned[tile]) if tile + 1 < parts else (own_stop, own_stop)
    return AxisWindow(extent, own_start, own_stop, reads[tile][0], reads[tile][1], neighbours[0], neighbours[1],
                      sends_before, sends_after)


def exchange_halo(tile: torch.Tensor, dim: int, window: AxisWindow, fill: float = 0.0) -> torch.Tensor:
    """The rows ``[read_start, read_stop)`` of the global tensor along ``dim``, for this tile (differentiable).

    Every tile of the axis must call this at the same point (it sends and receives). One autograd function:
    forward posts, waits and joins (the tile copied once, into the extended tensor); backward sends the
    halos' gradients home and adds what comes back onto a copy of the own rows' gradient — no zero-filled
    tile, no second full-tile sum (:func:`start_halo`/:func:`finish_halo`, which let a caller compute
    meanwhile, pay both).
    """
    return _Halo.apply(tile, dim, window, fill)


@dataclass
class PendingHalo:
    """A halo exchange in flight: the receive buffers (filled once :func:`finish_halo` waits) and the requests."""

    dim: int
    window: AxisWindow
    before: torch.Tensor
    after: torch.Tensor
    requests: list[dist.Work]
    keep: list[torch.Tensor]  # the outgoing rows, alive until the sends complete


def start_halo(tile: torch.Tensor, dim: int, window: AxisWindow) -> PendingHalo:
    """Post this tile's halo sends and receives without waiting (compute what needs no halo meanwhile)."""
    pending = PendingHalo(dim, window, tile, tile, [], [])
    pending.before, pending.after = _HaloStart.apply(tile, pending)
    return pending


def finish_halo(tile: torch.Tensor, pending: PendingHalo, fill: float = 0.0) -> torch.Tensor:
    """Wait for ``pending`` and return the tile extended by its halos and global padding (``fill``)."""
    return _HaloFinish.apply(tile, pending.before, pending.after, pending, fill)


def received_ranges(w: AxisWindow) -> tuple[tuple[int, int], tuple[int, int]]:
    """Global row ranges received from the neighbour before and after (empty ranges at borders)."""
    first, last = max(w.read_start, 0), min(w.read_stop, w.extent)
    before = (first, min(w.own_start, last)) if first < w.own_start else (first, first)
    after = (max(w.own_stop, first), last) if last > w.own_stop else (last, last)
    return before, after


class _StartContext(Protocol):
    dim: int
    window: AxisWindow
    shape: tuple[int, ...]
    where: tuple[str, ...]


class _FinishContext(Protocol):
    dim: int
    own_start: int
    shape: tuple[int, ...]
    kept: tuple[int, int]
    sizes: list[int]


class _HaloStart(torch.autograd.Function):
    """Forward: post the sends of this tile's rows and the receives of its halos. Backward: the adjoint."""

    @staticmethod
    def forward(ctx: _StartContext, tile: torch.Tensor, pending: PendingHalo) -> tuple[torch.Tensor, torch.Tensor]:
        w, dim = pending.window, pending.dim
        ctx.dim, ctx.window, ctx.shape, ctx.where = dim, w, tuple(tile.shape), place()
        outgoing, incoming = halo_messages(tile, dim, w)
        with exchange(exchange_name(dim), peers_of(w)):
            pending.requests = post_messages(outgoing, incoming)
        pending.keep = [rows for _, rows in outgoing]
        return incoming[0][1], incoming[1][1]

    @staticmethod
    def backward(ctx: _StartContext, grad_before: torch.Tensor | None,
                 grad_after: torch.Tensor | None) -> tuple[torch.Tensor, None]:
        w, dim = ctx.window, ctx.dim
        result = torch.zeros(ctx.shape, dtype=_dtype(grad_before, grad_after), device=_device(grad_before, grad_after))
        received_before, received_after = received_ranges(w)
        outgoing = [(w.before, _grad_or_zeros(grad_before, result, dim, received_before)),
                    (w.after, _grad_or_zeros(grad_after, result, dim, received_after))]
        incoming = [(w.before, empty_rows(result, dim, w.sends_before)),
                    (w.after, empty_rows(result, dim, w.sends_after))]
        with exchange(exchange_name(dim), peers_of(w), in_backward(ctx.where)):  # posting and waiting, labelled once
            for request in post_messages(outgoing, incoming):
                request.wait()
        for (start, stop), (_, rows) in zip((w.sends_before, w.sends_after), incoming):
            result.narrow(dim, start - w.own_start, stop - start).add_(rows)
        return result, None


class _HaloFinish(torch.autograd.Function):
    """Forward: wait, then join global padding, the halos and the rows of its own the tile's windows read."""

    @staticmethod
    def forward(ctx: _FinishContext, tile: torch.Tensor, before: torch.Tensor, after: torch.Tensor,
                pending: PendingHalo, fill: float) -> torch.Tensor:
        w, dim = pending.window, pending.dim
        wait_all(pending.requests, exchange_name(dim), peers_of(w))
        kept, pads = _joined(w)
        ctx.dim, ctx.own_start, ctx.shape, ctx.kept = dim, w.own_start, tuple(tile.shape), kept
        ctx.sizes = [pads[0], before.shape[dim], max(0, kept[1] - kept[0]), after.shape[dim], pads[1]]
        return torch.cat([_filled(tile, dim, pads[0], fill), before, _rows(tile, dim, kept, w.own_start), after,
                          _filled(tile, dim, pads[1], fill)], dim=dim)

    @staticmethod
    def backward(ctx: _FinishContext,
                 grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
        _, grad_before, grad_kept, grad_after, _ = torch.split(grad, ctx.sizes, dim=ctx.dim)
        grad_tile = grad.new_zeros(ctx.shape)
        if ctx.sizes[2]:
            grad_tile.narrow(ctx.dim, ctx.kept[0] - ctx.own_start, ctx.sizes[2]).add_(grad_kept)
        return grad_tile, grad_before.contiguous(), grad_after.contiguous(), None, None


class _HaloContext(Protocol):
    dim: int
    window: AxisWindow
    shape: tuple[int, ...]
    sizes: list[int]
    kept: tuple[int, int]
    where: tuple[str, ...]


class _Halo(torch.autograd.Function):
    """Forward: send this tile's rows, receive its halos, join them with global padding. Backward: the adjoint."""

    @staticmethod
    def forward(ctx: _HaloContext, tile: torch.Tensor, dim: int, w: AxisWindow, fill: float) -> torch.Tensor:
        outgoing, incoming = halo_messages(tile, dim, w)
        with exchange(exchange_name(dim), peers_of(w)):
            for request in post_messages(outgoing, incoming):
                request.wait()
        kept, pads = _joined(w)
        ctx.dim, ctx.window, ctx.shape, ctx.kept, ctx.where = dim, w, tuple(tile.shape), kept, place()
        ctx.sizes = [pads[0], incoming[0][1].shape[dim], max(0, kept[1] - kept[0]), incoming[1][1].shape[dim], pads[1]]
        own = tile.narrow(dim, kept[0] - w.own_start, ctx.sizes[2])  # a view: cat copies it once
        return torch.cat([_filled(tile, dim, pads[0], fill), incoming[0][1], own, incoming[1][1],
                          _filled(tile, dim, pads[1], fill)], dim=dim)

    @staticmethod
    def backward(ctx: _HaloContext, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        w, dim = ctx.window, ctx.dim
        _, grad_before, grad_kept, grad_after, _ = torch.split(grad, ctx.sizes, dim=dim)
        incoming = [(w.before, empty_rows(grad, dim, w.sends_before)),
                    (w.after, empty_rows(grad, dim, w.sends_after))]
        with exchange(exchange_name(dim), peers_of(w), in_backward(ctx.where)):  # posting and waiting, labelled once
            requests = post_messages([(w.before, grad_before.contiguous()), (w.after, grad_after.contiguous())],
                                     incoming)
            grad_tile = _own_gradient(grad_kept, ctx.shape, dim, ctx.kept[0] - w.own_start)  # meanwhile
            for request in requests:
                request.wait()
        for (start, stop), (_, rows) in zip((w.sends_before, w.sends_after), incoming):
            if rows.numel():
                grad_tile.narrow(dim, start - w.own_start, stop - start).add_(rows)
        return grad_tile, None, None, None


def _own_gradient(grad_kept: torch.Tensor, shape: tuple[int, ...], dim: int, offset: int) -> torch.Tensor:
    """The tile's gradient from the rows of its own its windows read: a copy, zero-padded only where the
    windows skip own rows (a strided layer's last rows)."""
    if grad_kept.shape[dim] == shape[dim]:
        return grad_kept.clone(memory_format=torch.contiguous_format)
    grad_tile = grad_kept.new_zeros(shape)
    grad_tile.narrow(dim, offset, grad_kept.shape[dim]).copy_(grad_kept)
    return grad_tile


def halo_messages(tile: torch.Tensor, dim: int, w: AxisWindow) -> tuple[list[tuple[int | None, torch.Tensor]],
                                                                      list[tuple[int | None, torch.Tensor]]]:
    """The rows this tile sends each neighbour, and empty buffers for the halos it receives from each."""
    received_before, received_after = received_ranges(w)
    outgoing = [(w.before, _rows(tile, dim, w.sends_before, w.own_start)),
                (w.after, _rows(tile, dim, w.sends_after, w.own_start))]
    incoming = [(w.before, empty_rows(tile, dim, received_before)),
                (w.after, empty_rows(tile, dim, received_after))]
    return outgoing, incoming


def _joined(w: AxisWindow) -> tuple[tuple[int, int], tuple[int, int]]:
    """The own rows the windows read (global range), and the global padding rows before and after them."""
    first, last = max(w.read_start, 0), min(w.read_stop, w.extent)
    kept = (max(first, w.own_start), min(last, w.own_stop))
    return kept, (max(0, -w.read_start), max(0, w.read_stop - w.extent))


def exchange_name(dim: int) -> str:
    return f"the halo exchange along {'HW'[dim - 2] if dim in (2, 3) else f'dim {dim}'}"


def peers_of(window: AxisWindow) -> list[int]:
    return [peer for peer in (window.before, window.after) if peer is not None]


def _grad_or_zeros(grad: torch.Tensor | None, like: torch.Tensor, dim: int, span: tuple[int, int]) -> torch.Tensor:
    return grad.contiguous() if grad is not None else empty_rows(like, dim, span).zero_()


def _dtype(*grads: torch.Tensor | None) -> torch.dtype:
    return next(g.dtype for g in grads if g is not None)


def _device(*grads: torch.Tensor | None) -> torch.device:
    return next(g.device for g in grads if g is not None)


def _read_range(o0: int, o1: int, kernel: int, stride: int, dilation: int, padding: int) -> tuple[int, int]:
    return o0 * stride - padding, (o1 - 1) * stride - padding + dilation * (kernel - 1) + 1


def _overlap(read: tuple[int, int], owned: tuple[int, int]) -> tuple[int, int]:
    start, stop = max(read[0], owned[0]), min(read[1], owned[1])
    return (start, stop) if start < stop else (owned[0], owned[0])


def _rows(tensor: torch.Tensor, dim: int, span: tuple[int, int], origin: int) -> torch.Tensor:
    return tensor.narrow(dim, span[0] - origin, max(0, span[1] - span[0])).contiguous()


def empty_rows(like: torch.Tensor, dim: int, span: tuple[int, int]) -> torch.Tensor:
    shape = list(like.shape)
    shape[dim] = max(0, span[1] - span[0])
    return like.new_empty(shape)


def _filled(like: torch.Tensor, dim: int, rows: int, fill: float) -> torch.Tensor:
    shape = list(like.shape)
    shape[dim] = rows
    return like.new_full(shape, fill)


def post_messages(outgoing: list[tuple[int | None, torch.Tensor]],
          incoming: list[tuple[int | None, torch.Tensor]]) -> list[dist.Work]:
    """Post every non-empty send and receive (non-blocking); the caller waits for the returned requests."""
    requests = [dist.isend(rows, peer) for peer, rows in outgoing if peer is not None and rows.numel()]
    requests += [dist.irecv(rows, peer) for peer, rows in incoming if peer is not None and rows.numel()]
    posted = [request for request in requests if request is not None]
    assert len(posted) == len(requests), "a peer outside the default group"  # isend/irecv return None there only
    return posted
