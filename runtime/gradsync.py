"""Summing each parameter's gradient over exactly the ranks that hold the same parameter (or slice).

Every rank's backward leaves in ``.grad`` its *share* of the unsplit gradient
— its samples, its tiles, its copy's part of the loss — so the unsplit
gradient is the sum of the shares over the ranks holding that parameter: all
ranks of the stage for an unsplit weight, the ranks with the same channel part
for a filter slice (``runtime.groups``, kind ``"slice"``).

As DDP's reducer does, gradients travel in persistent flat buckets of at most
``GRADIENT_BUCKET_BYTES`` (25 MiB, DDP's default; a larger parameter goes
alone) — the size ``cost_models.comm_cost`` prices — filled in reverse order
of the parameters (the order backward produces them). A bucket's allreduce
starts, asynchronously, as soon as its last gradient is accumulated, so the
sums overlap the rest of backward; buckets of one group start strictly in
order on every rank, on a process group of their own
(``GroupCache.gradient_group``) so that they never interleave with the halo
and norm collectives of the same ranks. At the end of backward (a callback
queued on the autograd engine, as DDP and FSDP do) the buckets not started
yet start — a gradient that never came counts as zero — and every sum is
waited for. Each ``.grad`` is its view of its bucket from the moment it is
copied in (DDP's ``gradient_as_bucket_view``): the tensor backward made is
freed at once, the summed gradient needs no copy back, and a step holds one
copy of the gradients, not two.

Inside :meth:`GradientSync.no_sync` (gradient accumulation) nothing is sent;
:meth:`GradientSync.sync` sums everything now.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable
from torch.utils.hooks import RemovableHandle

from cost_models.comm_cost import GRADIENT_BUCKET_BYTES
from runtime.groups import GroupCache
from runtime.waiting import exchange, in_backward

__all__ = ["FIRST_BUCKET_BYTES", "GradientSync"]

FIRST_BUCKET_BYTES = 1 << 20
"""The first bucket (the last layers' gradients) is small, as DDP's (``_DEFAULT_FIRST_BUCKET_BYTES``): the first
sum starts as early in backward as it can."""


@dataclass(eq=False)
class _Bucket:
    """One flat buffer of gradients of one replica group, and where each parameter's gradient lies in it."""

    ranks: tuple[int, ...]
    params: list[nn.Parameter]
    buffer: torch.Tensor
    views: list[torch.Tensor]
    filled: set[int] = field(default_factory=set)  # indices into params copied in this pass
    work: dist.Work | None = None

    @classmethod
    def of(cls, ranks: tuple[int, ...], params: list[nn.Parameter]) -> _Bucket:
        buffer = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        views, start = [], 0
        for param in params:
            views.append(buffer[start:start + param.numel()].view_as(param))
            start += param.numel()
        return cls(ranks, params, buffer, views)

    def put(self, index: int) -> None:
        """Copy parameter ``index``'s gradient in (zeros when it has none); the gradient becomes its view of the
        bucket, so the tensor backward made is freed at once and later accumulations land in the bucket."""
        param, view = self.params[index], self.views[index]
        if param.grad is None:
            view.zero_()
        elif param.grad.data_ptr() != view.data_ptr():
            view.copy_(param.grad)
        param.grad = view
        self.filled.add(index)

    @property
    def full(self) -> bool:
        return len(self.filled) == len(self.params)


class _Group:
    """The buckets of one replica group, started in order."""

    def __init__(self, ranks: tuple[int, ...], params: list[nn.Parameter]) -> None:
        self.ranks = ranks
        self.buckets = [_Bucket.of(ranks, chunk) for chunk in _buckets(list(reversed(params)))]
        self.started = 0

    def start_ready(self, process_group: dist.ProcessGroup, where: tuple[str, ...] | None) -> None:
        """Start the allreduce of every full bucket whose predecessors have started."""
        while self.started < len(self.buckets) and self.buckets[self.started].full:
            bucket = self.buckets[self.started]
            with exchange("the gradient allreduce", self.ranks, where):
                bucket.work = dist.all_reduce(bucket.buffer, group=process_group, async_op=True)
            self.started += 1

    def finish(self, process_group: dist.ProcessGroup, where: tuple[str, ...] | None) -> None:
        """Fill and start what is left, wait for every sum (each gradient is its view of its bucket)."""
        for bucket in self.buckets[self.started:]:
            for index in range(len(bucket.params)):
                if index not in bucket.filled:
                    bucket.put(index)
        self.start_ready(process_group, where)
        with exchange("the gradient allreduce", self.ranks, where):
            for bucket in self.buckets:
                if bucket.work is not None:
                    bucket.work.wait()
        for bucket in self.buckets:
            bucket.filled.clear()
            bucket.work = None
        self.started = 0


class GradientSync:
    """Sum gradients over replica groups: ``groups[ranks]`` lists the parameters those ranks share.

    ``cache`` must hold a gradient group for each of those ranks that this rank is one of
    (``GroupCache.build_gradients``).
    """

    def __init__(self, groups: Mapping[tuple[int, ...], Sequence[nn.Parameter]], cache: GroupCache) -> None:
        me = dist.get_rank() if dist.is_initialized() else 0
        self.cache = cache
        self.enabled = True
        self.where: tuple[str, ...] = ()
        """The place of the forward pass these gradients come from (``runtime.waiting``), for messages."""
        self._groups = [_Group(ranks, trainable) for ranks, params in sorted(groups.items())
                        if len(ranks) > 1 and me in ranks
                        and (trainable := [p for p in params if p.requires_grad])]
        self._slot = {id(param): (group, bucket, index) for group in self._groups for bucket in group.buckets
                      for index, param in enumerate(bucket.params)}
        self._queued = False
        self._handles: list[RemovableHandle] = []

    def install(self) -> None:
        """Synchronise by itself during and at the end of every backward pass that reaches these parameters."""
        for group in self._groups:
            for bucket in group.buckets:
                for param in bucket.params:
                    self._handles.append(param.register_post_accumulate_grad_hook(self._on_gradient))

    def buffers(self) -> list[torch.Tensor]:
        """The flat gradient buckets this rank holds (memory the gradients live in)."""
        return [bucket.buffer for group in self._groups for bucket in group.buckets]

    def sync(self) -> None:
        """Sum the gradients of every group over its ranks now (a missing gradient counts as zero)."""
        where = self._where()
        for group in self._groups:
            group.finish(self.cache.gradient_group(group.ranks), where)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Leave gradients unsynchronised inside (accumulate micro-batches, then sync once)."""
        enabled, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = enabled

    def _where(self) -> tuple[str, ...] | None:
        return in_backward(self.where) if self.where else None

    def _on_gradient(self, param: torch.Tensor) -> None:
        if not self.enabled:
            return
        if not self._queued:
            self._queued = True
            Variable._execution_engine.queue_callback(self._after_backward)
        group, bucket, index = self._slot[id(param)]
        bucket.put(index)
        if bucket.full:
            group.start_ready(self.cache.gradient_group(group.ranks), self._where())

    def _after_backward(self) -> None:
        self._queued = False
        self.sync()


def _buckets(params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
    """Consecutive runs of ``params`` of at most ``GRADIENT_BUCKET_BYTES`` each (a larger one alone), one dtype
    and device per run."""
    found: list[list[nn.Parameter]] = [[]]
    filled = 0
    for param in params:
        size = param.numel() * param.element_size()
        last = found[-1]
        cap = min(FIRST_BUCKET_BYTES, GRADIENT_BUCKET_BYTES) if len(found) == 1 else GRADIENT_BUCKET_BYTES
        if last and (filled + size > cap or (last[0].dtype, last[0].device) !=
                     (param.dtype, param.device)):
            found.append([])
            filled = 0
        found[-1].append(param)
        filled += size
    return [run for run in found if run]
