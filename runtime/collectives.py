"""A differentiable sum over a process group (the adjoint of a sum whose result every member uses is a sum).

``all_reduce_sum(x, group)`` returns on every member the sum of the members'
``x``; backward returns to each member the sum of the members' gradients of
that result. This is ``torch.distributed.nn.functional.all_reduce`` (now
deprecated) for the one operation the runtime needs.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist

from runtime.waiting import exchange, in_backward, place

__all__ = ["all_reduce_sum"]


class _SumContext(Protocol):
    group: dist.ProcessGroup | None
    where: tuple[str, ...]


def all_reduce_sum(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The sum of ``tensor`` over ``group`` (``None``: every rank), differentiable."""
    return _AllReduceSum.apply(tensor, group)


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: _SumContext, tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group, ctx.where = group, place()
        summed = tensor.contiguous().clone()
        with exchange("an allreduce of partial sums", _ranks(group)):
            dist.all_reduce(summed, group=group)
        return summed

    @staticmethod
    def backward(ctx: _SumContext, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        summed = grad.contiguous().clone()
        with exchange("an allreduce of partial sums", _ranks(ctx.group), in_backward(ctx.where)):
            dist.all_reduce(summed, group=ctx.group)
        return summed, None


def _ranks(group: dist.ProcessGroup | None) -> list[int]:
    return dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
