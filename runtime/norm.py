"""Batch-norm over a tensor split by space (and, if asked, by sample): statistics summed over the group;
group-norm (and instance-norm) over a tensor split by space: statistics per sample and group, summed over the tiles.

Each rank holds a tile ``(N_local, C, H_tile, W_tile)`` (or ``(N_local, C)``, ``(N_local, C, L)``).
The per-channel mean and variance of the unsplit layer are sums over every
sample and position, so the tiles' sums of ``x`` and ``x²`` are added over
``group`` — the ranks holding the other tiles of the same samples (and the
other samples' ranks for synchronised batch-norm) — in one allreduce of
``2·C`` float64 values; the count of values per channel is known from the
shapes. Accumulating in float64 (as PyTorch's CPU batch-norm does) keeps the
one-pass variance ``E[x²] − E[x]²`` accurate for float32 data.

Backward uses batch-norm's closed form, as cuDNN's and PyTorch's own kernels
do, with the two per-channel sums it needs (``Σ g`` and ``Σ g·x̂``) added over
the same group in one more allreduce: ``dx = (γ/σ)·(g − mean(g) −
x̂·mean(g·x̂))``. Differentiating the forward formula term by term instead is
exact in real arithmetic but not in float32: ``Σ(x − μ)`` is not zero in
rounding, and deep networks amplify that into percent-level gradient errors.
The weight and bias gradients returned are this tile's shares (``Σ g·x̂``,
``Σ g`` over the tile); summing them over the ranks gives the unsplit
gradients.

Running statistics follow ``torch.nn.BatchNorm2d`` (unbiased variance).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from runtime.failures import exchange, in_backward, place

__all__ = ["batch_norm", "group_norm"]


def batch_norm(tile: torch.Tensor, running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
               weight: torch.Tensor | None, bias: torch.Tensor | None, training: bool, momentum: float, eps: float,
               group: Any = None, count: int | None = None) -> torch.Tensor:
    """This tile of ``F.batch_norm`` of the tensor the tiles of ``group`` make up together.

    In evaluation (``training=False``) the running statistics are used and no
    communication happens. ``group`` is a process group (``None``: all ranks);
    ``count`` the number of values per channel over the group (summed over it when not given).
    """
    if not training:
        return F.batch_norm(tile, running_mean, running_var, weight, bias, False, 0.0, eps)
    channels = tile.shape[1]
    weight = weight if weight is not None else tile.new_ones(channels)
    bias = bias if bias is not None else tile.new_zeros(channels)
    if count is None:
        count = int(_summed(torch.tensor([tile.numel() // channels], device=tile.device), group).item())
    return _BatchNorm.apply(tile, weight, bias, running_mean, running_var, momentum, eps, group, count)


class _BatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tile: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None, momentum: float, eps: float,
                group: Any, count: int) -> torch.Tensor:
        dims, wide = _reduced(tile), _accumulator(tile)
        x = tile.to(wide)  # squares, sums and the normalisation in the accumulator: Σx² − (Σx)²/n cancels
        sums = _summed(torch.stack([x.sum(dim=dims), (x * x).sum(dim=dims)]), group)
        mean = sums[0] / count
        var = (sums[1] / count - mean * mean).clamp(min=0)
        inv_std_wide = torch.rsqrt(var + eps)
        normalised = ((x - _channel(mean, x)) * _channel(inv_std_wide, x)).to(tile.dtype)
        inv_std = inv_std_wide.to(tile.dtype)
        del x
        if running_mean is not None and running_var is not None:
            unbiased = var * count / max(count - 1, 1)
            running_mean.mul_(1 - momentum).add_(momentum * mean.to(running_mean.dtype))
            running_var.mul_(1 - momentum).add_(momentum * unbiased.to(running_var.dtype))
        ctx.save_for_backward(normalised, weight, inv_std)
        ctx.group, ctx.count, ctx.where = group, count, place()
        return normalised * _channel(weight, tile) + _channel(bias, tile)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        normalised, weight, inv_std = ctx.saved_tensors
        count = ctx.count
        dims, wide = _reduced(grad), _accumulator(grad)
        grad_bias = grad.sum(dim=dims, dtype=wide)
        grad_weight = (grad * normalised).sum(dim=dims, dtype=wide)
        sums = (_summed(torch.stack([grad_bias, grad_weight]), ctx.group, in_backward(ctx.where)) / count).to(grad.dtype)
        grad_bias, grad_weight = grad_bias.to(grad.dtype), grad_weight.to(grad.dtype)
        grad_input = (grad - _channel(sums[0], grad) - normalised * _channel(sums[1], grad)) \
            * _channel(weight * inv_std, grad)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None


def group_norm(tile: torch.Tensor, num_groups: int, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float, group: Any, count: int, first_channel: int = 0, channels: int | None = None) -> torch.Tensor:
    """This tile of ``F.group_norm(x, num_groups, weight, bias, eps)`` of the tensor the tiles of ``group`` (the
    ranks holding the other tiles and channels of the same samples) make up; ``count``: values per (sample,
    group) in it. The tile holds channels ``first_channel …`` of ``channels`` (default: all of them); ``weight``
    and ``bias`` are the tile's channels' (a channel split's groups may straddle its parts).

    Each (sample, group) is normalised by the mean and variance of its channels at every position of every
    tile: the tiles' ``Σx`` and ``Σx²`` per channel, in float64, are added into their groups and over ``group`` in
    one allreduce; backward adds ``Σ g·γ`` and ``Σ g·γ·x̂`` the same way (batch-norm's closed form, per sample
    and group). Instance-norm is the case of one channel a group. The weight and bias gradients returned are this
    tile's shares.
    """
    local = tile.shape[1]
    weight = weight if weight is not None else tile.new_ones(local)
    bias = bias if bias is not None else tile.new_zeros(local)
    size = (channels or local) // num_groups
    groups_of = torch.arange(first_channel, first_channel + local, device=tile.device) // size
    return _GroupNorm.apply(tile, weight, bias, num_groups, groups_of, eps, group, count)


_GROUP_NORM = "the group-norm statistics allreduce"


class _GroupNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tile: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, num_groups: int,
                groups_of: torch.Tensor, eps: float, group: Any, count: int) -> torch.Tensor:
        wide = _accumulator(tile)
        x = tile.to(wide).reshape(tile.shape[0], tile.shape[1], -1)
        sums = _summed(_into_groups(torch.stack([x.sum(dim=2), (x * x).sum(dim=2)]), groups_of, num_groups), group,
                       what=_GROUP_NORM)
        mean = sums[0] / count
        var = (sums[1] / count - mean * mean).clamp(min=0)
        inv_std = torch.rsqrt(var + eps)[:, groups_of]  # per sample and channel
        normalised = ((x - mean[:, groups_of, None]) * inv_std[..., None]).to(tile.dtype).reshape(tile.shape)
        ctx.save_for_backward(normalised, weight, inv_std.to(tile.dtype), groups_of)
        ctx.num_groups, ctx.group, ctx.count, ctx.where = num_groups, group, count, place()
        return normalised * _channel(weight, tile) + _channel(bias, tile)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        normalised, weight, inv_std, groups_of = ctx.saved_tensors
        wide, dims = _accumulator(grad), _reduced(grad)
        grad_bias, grad_weight = grad.sum(dim=dims, dtype=wide), (grad * normalised).sum(dim=dims, dtype=wide)
        scaled = (grad * _channel(weight, grad)).to(wide).reshape(grad.shape[0], grad.shape[1], -1)
        flat = normalised.to(wide).reshape(scaled.shape)
        sums = _summed(_into_groups(torch.stack([scaled.sum(dim=2), (scaled * flat).sum(dim=2)]), groups_of,
                                    ctx.num_groups), ctx.group, in_backward(ctx.where), _GROUP_NORM) / ctx.count
        grad_input = (scaled - sums[0][:, groups_of, None] - flat * sums[1][:, groups_of, None]) \
            * inv_std.to(wide)[..., None]
        return (grad_input.to(grad.dtype).reshape(grad.shape), grad_weight.to(grad.dtype), grad_bias.to(grad.dtype),
                None, None, None, None, None)


def _into_groups(per_channel: torch.Tensor, groups_of: torch.Tensor, num_groups: int) -> torch.Tensor:
    """``(2, N, C_local)`` sums per channel added into ``(2, N, num_groups)`` sums per group."""
    summed = per_channel.new_zeros((*per_channel.shape[:2], num_groups))
    return summed.index_add_(2, groups_of, per_channel)


def _accumulator(like: torch.Tensor) -> torch.dtype:
    """The dtype sums are accumulated in: float64 for floating types below it, as PyTorch's CPU kernels do."""
    return torch.float64 if like.is_floating_point() and like.dtype != torch.float64 else like.dtype


def _reduced(like: torch.Tensor) -> tuple[int, ...]:
    """Every dimension but the channels (1): samples and positions."""
    return (0, *range(2, like.dim()))


def _channel(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-channel ``values`` shaped to broadcast over ``like``."""
    return values.view(1, -1, *([1] * (like.dim() - 2)))


def _summed(tensor: torch.Tensor, group: Any, where: tuple[str, ...] | None = None,
            what: str = "the batch-norm statistics allreduce") -> torch.Tensor:
    if not (dist.is_available() and dist.is_initialized()):
        return tensor  # one process: the tile is the whole tensor
    summed = tensor.contiguous().clone()
    with exchange(what, where=where):
        dist.all_reduce(summed, group=group)
    return summed
