"""Batch-norm over a tensor split by space (and, if asked, by sample): statistics summed over the group;
group-norm (and instance-norm) over a tensor split by space: statistics per sample and group, summed over the tiles.

Each rank holds a tile ``(N_local, C, H_tile, W_tile)`` (or ``(N_local, C)``, ``(N_local, C, L)``).
Forward: each tile's per-channel mean and variance come from PyTorch's fused
kernel (``torch.batch_norm_update_stats``, accumulating in float64 on CPU),
are gathered over ``group`` — the ranks holding the other tiles of the same
samples (and the other samples' ranks for synchronised batch-norm) — in one
allgather of ``3·C`` float64 values (count, mean, variance) and combined with
Chan's parallel formula, which has no ``E[x²] − E[x]²`` cancellation; the
tile is then normalised by the fused inference kernel (``F.batch_norm`` with
those statistics): two passes over the tile, as the unsplit kernel makes.

Backward uses batch-norm's closed form, as cuDNN's and PyTorch's own kernels
do: ``dx = (γ/σ)·(g − mean(g) − x̂·mean(g·x̂))``. The tile's ``Σ g`` and
``Σ g·x̂`` come from the fused backward kernel (``native_batch_norm_backward``
with the group's statistics, input gradient masked off), are added over the
group in one allreduce, and ``dx`` is the fused inference kernel's affine map
of ``x`` plus ``(γ/σ)·g``. Differentiating the forward formula term by term
instead is exact in real arithmetic but not in float32: ``Σ(x − μ)`` is not
zero in rounding, and deep networks amplify that into percent-level gradient
errors. The weight and bias gradients returned are this tile's shares (``Σ g·x̂``,
``Σ g`` over the tile); summing them over the ranks gives the unsplit
gradients.

Running statistics follow ``torch.nn.BatchNorm2d`` (unbiased variance).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F

from runtime.waiting import exchange, in_backward, place

__all__ = ["batch_norm", "group_norm"]


class _NormContext(Protocol):
    """What the forward of a norm keeps for its backward."""

    saved_tensors: tuple[torch.Tensor, ...]
    group: dist.ProcessGroup | None
    count: int
    where: tuple[str, ...]

    def save_for_backward(self, *tensors: torch.Tensor) -> None: ...


class _BatchNormContext(_NormContext, Protocol):
    eps: float
    statistics: tuple[torch.Tensor, torch.Tensor]


class _GroupNormContext(_NormContext, Protocol):
    num_groups: int


def batch_norm(tile: torch.Tensor, running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
               weight: torch.Tensor | None, bias: torch.Tensor | None, training: bool, momentum: float, eps: float,
               group: dist.ProcessGroup | None = None, count: int | None = None) -> torch.Tensor:
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
    def forward(ctx: _BatchNormContext, tile: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None, momentum: float, eps: float,
                group: dist.ProcessGroup | None, count: int) -> torch.Tensor:
        mean, var = _group_statistics(tile, group)
        if running_mean is not None and running_var is not None:
            unbiased = var * count / max(count - 1, 1)
            running_mean.mul_(1 - momentum).add_(momentum * mean.to(running_mean.dtype))
            running_var.mul_(1 - momentum).add_(momentum * unbiased.to(running_var.dtype))
        narrow_mean, narrow_var = mean.to(tile.dtype), var.to(tile.dtype)
        ctx.save_for_backward(tile, weight, narrow_mean, narrow_var)
        ctx.group, ctx.count, ctx.eps, ctx.where, ctx.statistics = group, count, eps, place(), (mean, var)
        return _normalised(tile, mean, var, narrow_mean, weight, bias, eps)

    @staticmethod
    def backward(ctx: _BatchNormContext, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        tile, weight, mean, _ = ctx.saved_tensors
        wide_mean, wide_var = ctx.statistics
        inv_std = torch.rsqrt(wide_var + ctx.eps)
        # this tile's Σ g·x̂ and Σ g (its shares of the weight and bias gradients) in the fused kernel
        _, grad_weight, grad_bias = torch.ops.aten.native_batch_norm_backward(  # statistics in the weight's dtype
            grad, tile, weight, None, None, mean.to(weight.dtype), inv_std.to(weight.dtype), True, ctx.eps,
            [False, True, True])
        sums = _summed(torch.stack([grad_bias, grad_weight]).to(inv_std.dtype), ctx.group, in_backward(ctx.where))
        scale = weight.to(inv_std.dtype) * inv_std / ctx.count
        # dx = γ/σ·(g − Σg/n − x̂·Σg·x̂/n): the x̂ terms as an affine map of x, then + γ/σ·g
        grad_input = _normalised(tile, wide_mean, wide_var, mean, -scale * sums[1], -scale * sums[0], ctx.eps)
        grad_input.addcmul_(grad, _channel((scale * ctx.count).to(grad.dtype), grad))
        return grad_input, grad_weight.to(weight.dtype), grad_bias.to(weight.dtype), None, None, None, None, None, None


def _normalised(tile: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, narrow_mean: torch.Tensor,
                weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """``(x − μ)·γ/σ + β`` with one rounding of ``x − μ``: centred on ``μ`` in the tile's dtype, the rest of
    ``μ`` folded into the shift (the inference kernel folds all of ``μ·γ/σ`` into it: it cancels in float32)."""
    scale = weight.to(var.dtype) * torch.rsqrt(var + eps)
    shift = bias.to(var.dtype) - (mean - narrow_mean.to(mean.dtype)) * scale
    centred = tile - _channel(narrow_mean, tile)  # the one tensor it allocates, then scaled and shifted in place
    # (two in-place passes: a broadcast addcmul is 3–7× slower than both together on CPU)
    return centred.mul_(_channel(scale.to(tile.dtype), tile)).add_(_channel(shift.to(tile.dtype), tile))


def _group_statistics(tile: torch.Tensor, group: dist.ProcessGroup | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and (biased) variance over the tiles of ``group``, in the accumulator's dtype: each tile's
    from the fused kernel, combined with Chan's parallel formula (no ``E[x²] − E[x]²`` cancellation)."""
    wide = _accumulator(tile)
    mean, var = torch.batch_norm_update_stats(tile, None, None, 0.0)
    local = torch.stack([torch.full_like(mean, tile.numel() // tile.shape[1]), mean, var]).to(wide)
    counts, means, variances = _gathered(local, group).unbind(1)
    total = counts.sum(0)
    mean = (counts * means).sum(0) / total
    return mean, (counts * (variances + (means - mean) ** 2)).sum(0) / total


def group_norm(tile: torch.Tensor, num_groups: int, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float, group: dist.ProcessGroup | None, count: int, first_channel: int = 0,
               channels: int | None = None) -> torch.Tensor:
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
    def forward(ctx: _GroupNormContext, tile: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, num_groups: int,
                groups_of: torch.Tensor, eps: float, group: dist.ProcessGroup | None, count: int) -> torch.Tensor:
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
    def backward(ctx: _GroupNormContext, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
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


def _gathered(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """``tensor`` of every rank of ``group``, stacked along a new first dimension."""
    if not (dist.is_available() and dist.is_initialized()):
        return tensor[None]
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    with exchange("the batch-norm statistics allgather"):
        dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.stack(parts)


def _summed(tensor: torch.Tensor, group: dist.ProcessGroup | None, where: tuple[str, ...] | None = None,
            what: str = "the batch-norm statistics allreduce") -> torch.Tensor:
    if not (dist.is_available() and dist.is_initialized()):
        return tensor  # one process: the tile is the whole tensor
    summed = tensor.contiguous().clone()
    with exchange(what, where=where):
        dist.all_reduce(summed, group=group)
    return summed
