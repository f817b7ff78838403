"""Each local rank's threads on cores of their own (``processes.cores.pin_rank``), in forked processes."""

from __future__ import annotations

import os
import threading

import pytest
from distributed import run_ranks

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")


def _pinned(rank: int, world_size: int, threads: int) -> dict[str, object]:
    from processes.cores import pin_rank, unpinned

    before = sorted(os.sched_getaffinity(0))
    cores = pin_rank(rank, world_size, threads)
    seen: dict[str, object] = {"before": before, "cores": cores, "main": sorted(os.sched_getaffinity(0))}
    later: list[list[int]] = []
    worker = threading.Thread(target=lambda: later.append(sorted(os.sched_getaffinity(0))))
    worker.start()
    worker.join()
    seen["later_thread"] = later[0]
    with unpinned():
        seen["unpinned"] = sorted(os.sched_getaffinity(0))
    seen["after"] = sorted(os.sched_getaffinity(0))
    seen["again"] = pin_rank(rank, world_size, threads)
    return seen


@pytest.mark.parametrize("threads", [1, 2])
def test_each_local_rank_gets_its_own_share_of_the_cores_or_none_when_they_do_not_suffice(threads: int) -> None:
    for rank, seen in enumerate(run_ranks(_pinned, world_size=2, args=(threads,))):
        allowed = seen["before"]
        assert isinstance(allowed, list)
        share = len(allowed) // 2
        if share < threads:  # more ranks × threads than cores: nothing bound
            assert seen["cores"] is None and seen["main"] == allowed and seen["unpinned"] == allowed
            continue
        own = allowed[rank * share:(rank + 1) * share]
        assert seen["cores"] == tuple(own) and seen["main"] == own
        assert seen["later_thread"] == own  # a thread started after binding inherits it (gloo's, OpenMP's)
        assert seen["unpinned"] == allowed and seen["after"] == own
        assert seen["again"] == tuple(own)  # idempotent: the share is of the cores before binding
