"""Filter (output-channel) split of convolution and linear layers, as in Megatron-LM's column parallelism.

Each rank of a ``c``-way group holds a slice of the filters (weight rows and
bias entries ``partition(C_out, c)[k]``) and the whole input in the channel
dimension. Forward computes its slice of the output channels with no
communication; backward sums the input gradients of the slices over the group
(``copy_to_group``: identity forward, allreduce backward). The weight and bias
gradients of each slice are complete on their rank.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from cost_models.halo import partition

__all__ = ["conv2d_filter_slice", "copy_to_group", "filter_slice", "linear_filter_slice"]


def filter_slice(out_channels: int, parts: int, index: int) -> slice:
    """The output channels slice ``index`` of a ``parts``-way split holds (balanced)."""
    start, stop = partition(out_channels, parts)[index]
    return slice(start, stop)


def copy_to_group(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Identity forward; backward sums the gradient over ``group`` (every member must take part)."""
    return _CopyToGroup.apply(tensor, group)


def conv2d_filter_slice(x: torch.Tensor, weight_slice: torch.Tensor, bias_slice: torch.Tensor | None, group: Any,
                        **conv: Any) -> torch.Tensor:
    """This rank's output channels of ``F.conv2d``; ``x`` has every input channel."""
    return F.conv2d(copy_to_group(x, group), weight_slice, bias_slice, **conv)


def linear_filter_slice(x: torch.Tensor, weight_slice: torch.Tensor, bias_slice: torch.Tensor | None,
                        group: Any) -> torch.Tensor:
    """This rank's output features of ``F.linear``; ``x`` has every input feature."""
    return F.linear(copy_to_group(x, group), weight_slice, bias_slice)


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        summed = grad.contiguous().clone()
        dist.all_reduce(summed, group=ctx.group)
        return summed, None
