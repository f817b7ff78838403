"""Gradients of one replica group travel in buckets of at most ``GRADIENT_BUCKET_BYTES`` — the size the cost model prices.

Two gloo ranks, the bucket size shrunk so that four parameters take three buckets (one larger than a bucket goes
alone): every gradient is the sum over the ranks, a missing one counts as zero, and one allreduce runs per bucket.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from distributed import run_ranks


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
        gradsync.GradientSync({tuple(range(world_size)): params}, GroupCache(range(world_size))).sync()
    finally:
        gradsync.dist.all_reduce = reduce
    return {"calls": calls, "grads": [p.grad.tolist() for p in params]}


def test_gradients_are_summed_in_buckets_of_the_priced_size() -> None:
    results = run_ranks(_sync_in_small_buckets, world_size=2)
    for found in results:
        assert found["calls"] == 3  # [6, 8] fit in 16 values; 40 alone; 3 alone (it would overfill the 40's)
        for index, size in enumerate((6, 8, 40)):
            expected = [3.0 * value + 2 * index for value in range(size)]  # (1 + 2)·value + index on each rank
            assert found["grads"][index] == expected
        assert found["grads"][3] == [0.0, 0.0, 0.0]
