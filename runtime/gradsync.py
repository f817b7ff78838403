"""Summing each parameter's gradient over exactly the ranks that hold the same parameter (or slice).

Every rank's backward leaves in ``.grad`` its *share* of the unsplit gradient
— its samples, its tiles, its copy's part of the loss — so the unsplit
gradient is the sum of the shares over the ranks holding that parameter: all
ranks of the stage for an unsplit weight, the ranks with the same channel part
for a filter slice (``runtime.groups``, kind ``"slice"``). Gradients of one
group travel in flat buffers of at most ``GRADIENT_BUCKET_BYTES`` (25 MiB,
DDP's default bucket; a larger parameter goes alone) — the size
``cost_models.comm_cost`` prices — groups in a fixed order on every rank.

Synchronisation runs by itself at the end of each backward pass (a callback
queued on the autograd engine by the first parameter whose gradient is
accumulated, as FSDP does), unless inside :meth:`GradientSync.no_sync`
(gradient accumulation), or it can be called as :meth:`GradientSync.sync`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.autograd import Variable

from cost_models.comm_cost import GRADIENT_BUCKET_BYTES
from runtime.failures import exchange, in_backward
from runtime.groups import GroupCache

__all__ = ["GradientSync"]


class GradientSync:
    """Sum gradients over replica groups: ``groups[ranks]`` lists the parameters those ranks share."""

    def __init__(self, groups: Mapping[tuple[int, ...], Sequence[nn.Parameter]], cache: GroupCache) -> None:
        self.groups = {ranks: list(params) for ranks, params in sorted(groups.items()) if len(ranks) > 1}
        self.cache = cache
        self.enabled = True
        self.where: tuple[str, ...] = ()
        """The place of the forward pass these gradients come from (``runtime.failures``), for messages."""
        self._queued = False
        self._handles: list[Any] = []

    def install(self) -> None:
        """Synchronise by itself at the end of every backward pass that reaches these parameters."""
        for params in self.groups.values():
            for param in params:
                if param.requires_grad:
                    self._handles.append(param.register_post_accumulate_grad_hook(self._on_gradient))

    def sync(self) -> None:
        """Sum the gradients of every group over its ranks now (a missing gradient counts as zero)."""
        me = dist.get_rank()
        for ranks, params in self.groups.items():
            if me not in ranks:
                continue
            trainable = [p for p in params if p.requires_grad]
            if not trainable:
                continue
            for bucket in _buckets(trainable):
                self._sum(bucket, ranks)

    def _sum(self, params: list[nn.Parameter], ranks: tuple[int, ...]) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = _flatten_dense_tensors(grads)
        with exchange("the gradient allreduce", ranks, in_backward(self.where) if self.where else None):
            dist.all_reduce(flat, group=self.cache.get(ranks))
        for param, summed in zip(params, _unflatten_dense_tensors(flat, grads)):
            if param.grad is None:
                param.grad = summed
            else:
                param.grad.copy_(summed)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Leave gradients unsynchronised inside (accumulate micro-batches, then sync once)."""
        enabled, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = enabled

    def _on_gradient(self, _param: torch.Tensor) -> None:
        if self.enabled and not self._queued:
            self._queued = True
            Variable._execution_engine.queue_callback(self._after_backward)

    def _after_backward(self) -> None:
        self._queued = False
        self.sync()


def _buckets(params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
    """Consecutive runs of ``params`` of at most ``GRADIENT_BUCKET_BYTES`` each (a larger one alone)."""
    found: list[list[nn.Parameter]] = [[]]
    filled = 0
    for param in params:
        size = param.numel() * param.element_size()
        if found[-1] and filled + size > GRADIENT_BUCKET_BYTES:
            found.append([])
            filled = 0
        found[-1].append(param)
        filled += size
    return found
