"""Gradients of one replica group travel in buckets of at most ``GRADIENT_BUCKET_BYTES`` — the size the cost model prices.

Two gloo ranks, the bucket size shrunk so that four parameters take three buckets (one larger than a bucket goes
alone): every gradient is the sum over the ranks, a missing one counts as zero, and one allreduce runs per bucket.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from distributed import run_ranks
from torch import nn


def _sync_in_small_buckets(rank: int, world_size: int) -> dict[str, Any]:
    import runtime.gradsync as gradsync
    from runtime.groups import GroupCache

    gradsync.GRADIENT_BUCKET_BYTES = 64  # 16 float32 values
    params = [nn.Parameter(torch.zeros(size, dtype=torch.float32)) for size in (6, 8, 40, 3)]
    for index, param in enumerate(params[:3]):  # the last has no gradient on any rank
        param.grad = torch.arange(param.numel(), dtype=torch.float32) * (rank + 1) + index
    calls = 0
    reduce = dist.all_reduce

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return reduce(*args, **kwargs)

    gradsync.dist.all_reduce = counted
    try:
        cache = GroupCache(range(world_size))
        cache.build_gradients([tuple(range(world_size))])
        gradsync.GradientSync({tuple(range(world_size)): params}, cache).sync()
    finally:
        gradsync.dist.all_reduce = reduce
    return {"calls": calls, "grads": [p.grad.tolist() for p in params]}


def test_gradients_are_summed_in_buckets_of_the_priced_size() -> None:
    results = run_ranks(_sync_in_small_buckets, world_size=2)
    for found in results:
        assert found["calls"] == 3  # in backward's order: 3 alone (the 40 would overfill it); 40 alone; [8, 6] in 16 values
        for index, size in enumerate((6, 8, 40)):
            expected = [3.0 * value + 2 * index for value in range(size)]  # (1 + 2)·value + index on each rank
            assert found["grads"][index] == expected
        assert found["grads"][3] == [0.0, 0.0, 0.0]


class _Marker(torch.autograd.Function):
    """Identity; its backward (the last node backward runs) records how many allreduces had started by then."""

    started: list[int] = []
    calls = 0

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        _Marker.started.append(_Marker.calls)
        return grad


def _overlapped(rank: int, world_size: int) -> dict[str, Any]:
    import runtime.gradsync as gradsync
    from runtime.groups import GroupCache

    gradsync.GRADIENT_BUCKET_BYTES = 64  # one 4×4 weight a bucket
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4)).double()
    reference = [torch.zeros_like(p) for p in model.parameters()]
    for source in range(world_size):  # every rank's share, computed here to know the sum
        model.zero_grad()
        model(torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(source))).sum().backward()
        reference = [r + p.grad for r, p in zip(reference, model.parameters())]
    model.zero_grad(set_to_none=True)
    reduce = dist.all_reduce
    _Marker.started, _Marker.calls = [], 0  # ranks may be reused across tests

    def counted(*args: Any, **kwargs: Any) -> Any:
        _Marker.calls += 1
        return reduce(*args, **kwargs)

    gradsync.dist.all_reduce = counted
    try:
        cache = GroupCache(range(world_size))
        cache.build_gradients([tuple(range(world_size))])
        sync = gradsync.GradientSync({tuple(range(world_size)): list(model.parameters())}, cache)
        sync.install()
        x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(rank)).requires_grad_()
        for _ in range(2):  # twice: the buckets are reused, the grads set to None in between
            model.zero_grad(set_to_none=True)
            model(_Marker.apply(x)).sum().backward()
    finally:
        gradsync.dist.all_reduce = reduce
    return {"started": _Marker.started, "calls": _Marker.calls,
            "error": max(float((p.grad - r).abs().max()) for p, r in zip(model.parameters(), reference))}


def test_buckets_are_summed_while_backward_runs_on() -> None:
    for found in run_ranks(_overlapped, world_size=2):
        assert found["calls"] == 2 * 6  # in backward's order b4, w4, b2, …: each weight overfills its bias's bucket
        assert found["started"][0] >= 4 and found["started"][1] >= 6 + 4  # the last layers' sums began early
        assert found["error"] < 1e-12
