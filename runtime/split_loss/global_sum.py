"""Sums over the ranks that hold a value's parts, with their adjoint: the building block of a loss kept split.

A loss such as Dice is a function of sums over every pixel of the batch; on
tiles, each rank sums its own pixels and the ranks then add their partial
sums (one allreduce). Its adjoint is again an allreduce: the gradient of the
total reaches every part from every rank that used the total
(:class:`GlobalSum`), so the loss may use the total in any way, the same or
not on every rank.

A group may hold more ranks than the parts being added, with the value
replicated along the extra ones (a total over a sample's tiles, reduced on the
group of every sample's tiles after the samples were summed already): the sum
over the group is then divided by their number, ``replicas`` — forward and
backward, exactly.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist

from runtime.waiting import exchange, in_backward, place

__all__ = ["global_extreme", "global_sum"]


def global_sum(part: torch.Tensor, group: dist.ProcessGroup | None, replicas: int = 1) -> torch.Tensor:
    """The sum of ``part`` over the ranks of ``group`` ÷ ``replicas``, on every one of them (differentiable).

    ``group`` ``None`` is this rank alone (the value itself ÷ ``replicas``).
    """
    return _GlobalSum.apply(part, group, replicas)


def global_extreme(part: torch.Tensor, group: dist.ProcessGroup | None, largest: bool) -> torch.Tensor:
    """The elementwise maximum (``largest``) or minimum of ``part`` over ``group``; no gradient flows."""
    total = part.detach().clone()
    if group is not None:
        with exchange("a loss's maximum over the ranks" if largest else "a loss's minimum over the ranks"):
            dist.all_reduce(total, dist.ReduceOp.MAX if largest else dist.ReduceOp.MIN, group=group)
    return total


class _SumContext(Protocol):
    group: dist.ProcessGroup | None
    replicas: int
    where: tuple[str, ...]


class _GlobalSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: _SumContext, part: torch.Tensor, group: dist.ProcessGroup | None,
                replicas: int) -> torch.Tensor:
        ctx.group, ctx.replicas, ctx.where = group, replicas, in_backward(place())
        return _summed(part.contiguous().clone(), group, replicas, "a loss's sum over the ranks", None)

    @staticmethod
    def backward(ctx: _SumContext, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _summed(grad.contiguous().clone(), ctx.group, ctx.replicas,
                       "the gradient of a loss's sum over the ranks", ctx.where), None, None


def _summed(total: torch.Tensor, group: dist.ProcessGroup | None, replicas: int, what: str,
            where: tuple[str, ...] | None) -> torch.Tensor:
    if group is not None:
        with exchange(what, where=where):
            dist.all_reduce(total, group=group)
    return total / replicas if replicas > 1 else total
