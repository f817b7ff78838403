"""Batch-norm over a tensor split by space (and, if asked, by sample): statistics summed over the group.

Each rank holds a tile ``(N_local, C, H_tile, W_tile)``. The per-channel mean
and variance of the unsplit layer are sums over every sample and position,
so the tiles' partial sums are added over ``group`` — the ranks holding the
other tiles of the same samples (and the other samples' ranks for
synchronised batch-norm). The sums go through
``torch.distributed.nn.functional.all_reduce``, whose backward adds the
gradients over the same group, so autograd gives each tile exactly its part of
the unsplit input gradient. The variance is computed in two passes (mean
first, then the mean square deviation) to avoid cancellation in float32.
Running statistics follow ``torch.nn.BatchNorm2d`` (unbiased variance).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

__all__ = ["batch_norm"]


def batch_norm(tile: torch.Tensor, running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
               weight: torch.Tensor | None, bias: torch.Tensor | None, training: bool, momentum: float, eps: float,
               group: Any = None) -> torch.Tensor:
    """This tile of ``F.batch_norm`` of the tensor the tiles of ``group`` make up together.

    In evaluation (``training=False``) the running statistics are used and no
    communication happens. ``group`` is a process group (``None``: all ranks).
    """
    shape = (1, -1, 1, 1)
    if not training:
        mean, var = running_mean, running_var
    else:
        count = _summed(torch.tensor([tile.numel() / tile.shape[1]], dtype=tile.dtype, device=tile.device), group)
        mean = _summed(tile.sum(dim=(0, 2, 3)), group) / count
        var = _summed(((tile - mean.view(shape)) ** 2).sum(dim=(0, 2, 3)), group) / count
        if running_mean is not None and running_var is not None:
            with torch.no_grad():
                unbiased = var * count / (count - 1).clamp(min=1)
                running_mean.mul_(1 - momentum).add_(momentum * mean)
                running_var.mul_(1 - momentum).add_(momentum * unbiased)
    out = (tile - mean.view(shape)) / torch.sqrt(var.view(shape) + eps)  # type: ignore[union-attr]
    if weight is not None:
        out = out * weight.view(shape)
    if bias is not None:
        out = out + bias.view(shape)
    return out


def _summed(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    if not (dist.is_available() and dist.is_initialized()):
        return tensor  # one process: the tile is the whole tensor
    return dist_fn.all_reduce(tensor, group=group if group is not None else dist.group.WORLD)
