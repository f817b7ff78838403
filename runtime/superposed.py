"""Convolution on a tile split along one axis: one kernel call over the bare tile, the halos added after.

A convolution is linear in its input, so the convolution of the tile joined
with its halos is the convolution of the bare tile — its own padding standing
where the halo rows belong — plus the convolution of the halos alone, zeros
where the tile's rows are. The second term touches only the few output rows
whose windows reach past the tile's border (one row each side for a 3×3
convolution), computed from a thin *band*: the halo with zero rows around it.
So :func:`conv_superposed`

* posts the halo exchange (non-blocking) and convolves the bare tile
  meanwhile — one kernel call over the whole tile, no copy of it (the joined
  form copies the tile into the extended tensor each layer, and its backward
  copies the gradient back out);
* waits, convolves each band and adds it onto its output rows in place;
* backward, convolves each band's gradient first and sends the halos'
  gradients home, computes the tile's gradients meanwhile, then adds what the
  neighbours send onto the border rows.

The bare tile's convolution reads exactly the global windows when the tile's
first row is its first output's first window row (``own_start = o0·s``) and
its own padding gives the tile's output count (:func:`superposable`); other
tiles (a stride that does not divide a tile's start, uneven splits) use the
joined form. Only one split axis: a grid split along two axes has corners
that arrive with the second axis's exchange (``runtime.spatial`` joins those).

Assumptions: zero padding (other padding modes are ``runtime.borders``');
floating tiles. Under autocast the tile, weight and bias are cast to the
autocast dtype first, as autocast casts a convolution's inputs (float64 is
left alone, as autocast leaves it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from runtime.halo_exchange import (
                                   AxisWindow,
                                   empty_rows,
                                   exchange_name,
                                   halo_messages,
                                   peers_of,
                                   post_messages,
                                   received_ranges,
)
from runtime.waiting import exchange, in_backward, place, wait_all

__all__ = ["Band", "Superposition", "conv_superposed", "superposable", "superposition"]

Conv = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Band:
    """The output rows ``[first, stop)`` (local) a halo's rows reach, and the band that computes their share:
    local input rows ``[start, start + length)``, holding ``count`` rows of the halo from its row ``skip`` at
    ``offset`` (all of them, but where the windows skip some)."""

    first: int
    stop: int
    start: int
    length: int
    offset: int
    count: int
    skip: int


@dataclass(frozen=True)
class Superposition:
    """How one tile's convolution is computed: the split axis (``dim``, 2 + spatial axis), its window, the
    convolution's stride, padding and dilation on every spatial axis, its groups, and the bands of the halos
    received before and after the tile (``None``: no halo on that side, or none that reaches an output)."""

    dim: int
    window: AxisWindow
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    before: Band | None
    after: Band | None

    def band_padding(self) -> tuple[int, ...]:
        """A band's padding: the convolution's own on every axis but the split one."""
        return tuple(0 if 2 + axis == self.dim else pad for axis, pad in enumerate(self.padding))


def superposable(window: AxisWindow, outputs: tuple[int, int], kernel: int, stride: int, padding: int,
                 dilation: int) -> bool:
    """Whether the bare tile's convolution with its own padding reads exactly the global windows of its output
    rows ``outputs`` (global ``[o0, o1)``) along the split axis."""
    rows, (first, stop) = window.own_stop - window.own_start, outputs
    if stop <= first or rows <= 0:
        return False
    local_outputs = (rows + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    return window.own_start == first * stride and local_outputs == stop - first


def superposition(window: AxisWindow, axis: int, kernel: int, stride: tuple[int, ...], padding: tuple[int, ...],
                  dilation: tuple[int, ...], groups: int) -> Superposition:
    """The :class:`Superposition` of a tile split along spatial ``axis`` (check :func:`superposable` first)."""
    s, p, reach = stride[axis], padding[axis], dilation[axis] * (kernel - 1)
    rows = window.own_stop - window.own_start
    outputs = (rows + 2 * p - reach - 1) // s + 1
    before_rows, after_rows = received_ranges(window)
    halo_before = (before_rows[0] - window.own_start, before_rows[1] - window.own_start)
    halo_after = (after_rows[0] - window.own_start, after_rows[1] - window.own_start)
    before = _band((0, min(outputs, -(-p // s))), halo_before, s, p, reach)
    after = _band((max(0, -(-(rows + p - reach) // s)), outputs), halo_after, s, p, reach)
    return Superposition(2 + axis, window, stride, padding, dilation, groups, before, after)


def _band(outputs: tuple[int, int], halo: tuple[int, int], s: int, p: int, reach: int) -> Band | None:
    """The band of the halo's local rows ``halo`` for the output rows ``outputs`` (``None`` if either is empty
    or the outputs' windows miss the halo)."""
    first, stop = outputs
    if stop <= first or halo[1] <= halo[0]:
        return None
    start, end = first * s - p, (stop - 1) * s - p + reach + 1
    low, high = max(start, halo[0]), min(end, halo[1])
    if high <= low:
        return None
    return Band(first, stop, start, end - start, low - start, high - low, low - halo[0])


def conv_superposed(conv: Conv, tile: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    plan: Superposition) -> torch.Tensor:
    """``conv`` (``F.conv1d/2d/3d``) of the tile joined with its halos along ``plan.dim`` (differentiable)."""
    device = tile.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        tile, weight, bias = (_cast(value, dtype) for value in (tile, weight, bias))  # type: ignore[assignment]
        with torch.autocast(device, enabled=False):
            return _Superposed.apply(tile, weight, bias, conv, plan)
    return _Superposed.apply(tile, weight, bias, conv, plan)


def _cast(value: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if value is None or not value.is_floating_point() or value.dtype == torch.float64:
        return value
    return value.to(dtype)


class _Context(Protocol):
    saved_tensors: tuple[torch.Tensor, ...]
    needs_input_grad: tuple[bool, ...]
    plan: Superposition
    has_bias: bool
    where: tuple[str, ...]

    def save_for_backward(self, *tensors: torch.Tensor) -> None: ...


class _Superposed(torch.autograd.Function):
    """Forward: post the exchange, convolve the bare tile, wait, add the bands. Backward: the adjoint."""

    @staticmethod
    def forward(ctx: _Context, tile: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv: Conv,
                plan: Superposition) -> torch.Tensor:
        w, dim = plan.window, plan.dim
        outgoing, incoming = halo_messages(tile, dim, w)
        with exchange(exchange_name(dim), peers_of(w)):
            requests = post_messages(outgoing, incoming)
        out = conv(tile, weight, bias, plan.stride, plan.padding, plan.dilation, plan.groups)  # meanwhile
        wait_all(requests, exchange_name(dim), peers_of(w))
        bands = [_band_input(tile, rows, band, dim) if band is not None else tile.new_empty(0)
                 for band, (_, rows) in zip((plan.before, plan.after), incoming)]
        for band, values in zip((plan.before, plan.after), bands):
            if band is not None:
                share = conv(values, weight, None, plan.stride, plan.band_padding(), plan.dilation, plan.groups)
                out.narrow(dim, band.first, band.stop - band.first).add_(share)
        ctx.save_for_backward(tile, weight, *bands)
        ctx.plan, ctx.has_bias, ctx.where = plan, bias is not None, place()
        return out

    @staticmethod
    def backward(ctx: _Context, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        tile, weight, band_before, band_after = ctx.saved_tensors
        plan, (need_input, need_weight, need_bias) = ctx.plan, ctx.needs_input_grad[:3]
        halo_grads, grad_weight = [], None
        for band, values, rows in zip((plan.before, plan.after), (band_before, band_after),
                                      received_ranges(plan.window)):
            like = empty_rows(tile, plan.dim, rows)
            halo_grad, band_weight = _band_backward(grad, values, weight, band, like, plan, need_input, need_weight)
            halo_grads.append(halo_grad)
            grad_weight = band_weight if grad_weight is None else _sum(grad_weight, band_weight)
        requests, incoming = (_post_gradients(halo_grads, tile, plan) if need_input else ([], []))
        grad_tile, whole_weight, grad_bias = torch.ops.aten.convolution_backward(
            grad, tile, weight, [weight.shape[0]] if ctx.has_bias else None, plan.stride, plan.padding,
            plan.dilation, False, [0] * len(plan.stride), plan.groups, [need_input, need_weight, need_bias])
        if need_input:
            with exchange(exchange_name(plan.dim), peers_of(plan.window), in_backward(ctx.where)):
                for request in requests:
                    request.wait()
            _add_home(grad_tile, incoming, plan)
        return grad_tile, _sum(grad_weight, whole_weight), grad_bias if ctx.has_bias else None, None, None


def _band_input(tile: torch.Tensor, halo: torch.Tensor, band: Band, dim: int) -> torch.Tensor:
    """The band: zeros, the halo's rows at their place."""
    shape = list(tile.shape)
    shape[dim] = band.length
    values = tile.new_zeros(shape)
    values.narrow(dim, band.offset, band.count).copy_(_halo_rows(halo, band, dim))
    return values


def _halo_rows(halo: torch.Tensor, band: Band, dim: int) -> torch.Tensor:
    """The rows of the received halo that lie in the band."""
    return halo.narrow(dim, band.skip, band.count)


def _band_backward(grad: torch.Tensor, values: torch.Tensor, weight: torch.Tensor, band: Band | None,
                   like: torch.Tensor, plan: Superposition, need_input: bool,
                   need_weight: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gradient of a received halo (``like``'s shape; zeros where no window reads) and the band's share of
    the weight gradient."""
    if band is None:
        return like.new_zeros(like.shape), None
    rows = grad.narrow(plan.dim, band.first, band.stop - band.first)
    grad_band, grad_weight, _ = torch.ops.aten.convolution_backward(
        rows, values, weight, None, plan.stride, plan.band_padding(), plan.dilation, False,
        [0] * len(plan.stride), plan.groups, [need_input, need_weight, False])
    halo_grad = like.new_zeros(like.shape)
    if need_input:
        _halo_rows(halo_grad, band, plan.dim).copy_(grad_band.narrow(plan.dim, band.offset, band.count))
    return halo_grad, grad_weight


def _post_gradients(halo_grads: list[torch.Tensor], tile: torch.Tensor,
                    plan: Superposition) -> tuple[list[dist.Work], list[torch.Tensor]]:
    """Send each halo's gradient to its owner; post the receives of the gradients of the rows this tile sent."""
    w = plan.window
    incoming = [empty_rows(tile, plan.dim, w.sends_before), empty_rows(tile, plan.dim, w.sends_after)]
    with exchange(exchange_name(plan.dim), peers_of(w)):
        requests = post_messages([(w.before, halo_grads[0]), (w.after, halo_grads[1])],
                                 [(w.before, incoming[0]), (w.after, incoming[1])])
    return requests, incoming


def _add_home(grad_tile: torch.Tensor, incoming: list[torch.Tensor], plan: Superposition) -> None:
    """Add the gradients the neighbours computed for this tile's rows onto those rows."""
    w = plan.window
    for (start, stop), rows in zip((w.sends_before, w.sends_after), incoming):
        if rows.numel():
            grad_tile.narrow(plan.dim, start - w.own_start, stop - start).add_(rows)


def _sum(first: torch.Tensor | None, second: torch.Tensor | None) -> torch.Tensor | None:
    if first is None:
        return second
    return first if second is None else first.add_(second)
