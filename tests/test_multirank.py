"""Tier 3: several gloo ranks on CPU agree with the single process.

Every rank of a distributed run traces the user's model itself, and the plan
is checked against the fingerprint each rank computes. Spawned ranks get
their own Python hash seeds, so this is where an unstable fingerprint (one
that depended on ``hash()``, object ids or dict order) would show.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist
from conftest import SMALL_SHAPE, build_model
from distributed import run_ranks

from cost_models.ir.tracing import trace

pytestmark = pytest.mark.multirank


def _trace_and_share(rank: int, world_size: int, model_name: str) -> list[str]:
    graph = trace(build_model(model_name), SMALL_SHAPE)
    gathered: list[object] = [None] * world_size
    dist.all_gather_object(gathered, (graph.fingerprint, graph.totals()["params"]))
    return gathered  # type: ignore[return-value]


@pytest.mark.parametrize(("model_name", "world_size"), [("resnet18", 2), ("unet", 3)])
def test_every_rank_traces_the_same_graph(model_name: str, world_size: int) -> None:
    reference = trace(build_model(model_name), SMALL_SHAPE)
    results = run_ranks(_trace_and_share, world_size, args=(model_name,), start="spawn")  # own hash seeds
    expected = [(reference.fingerprint, reference.totals()["params"])] * world_size
    assert all(gathered == expected for gathered in results)


def _fail_on_rank_one(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("rank one breaks")
    return rank


def test_a_failing_rank_is_reported_with_its_traceback() -> None:
    with pytest.raises(AssertionError, match=r"rank 1 failed:[\s\S]*ValueError: rank one breaks"):
        run_ranks(_fail_on_rank_one, 2)


def _die_on_rank_zero(rank: int, world_size: int) -> int:
    if rank == 0:
        import os

        os._exit(3)
    return rank


def test_a_dead_rank_fails_fast() -> None:
    with pytest.raises(AssertionError, match=r"ranks \[0\] died without reporting \(exit codes \{0: 3\}\)"):
        run_ranks(_die_on_rank_zero, 2, timeout_s=60)
