"""Tier-3 test base: spawn ``world_size`` CPU ranks with gloo and collect what each returns.

Usage::

    results = run_ranks(my_rank_function, world_size=2, args=(...,))

``my_rank_function(rank, world_size, *args)`` runs inside an initialised
default process group (gloo, ``file://`` rendezvous in a fresh temporary
directory) and returns something picklable; ``run_ranks`` returns the list of
results in rank order, and re-raises the first rank's failure with its
traceback. Functions must be importable at module level (they are pickled by reference).
"""

from __future__ import annotations

import queue as queue_module
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from processes.forked import server_preload

__all__ = ["run_ranks", "survivors"]

RankFunction = Callable[..., Any]
PRELOAD = server_preload(["torch", "torchvision", "torch.distributed", "distributed", "cost_models.ir.graph",
                          "runtime.apply"])
"""Imported once by the fork server, so that every rank starts with them loaded."""


def run_ranks(fn: RankFunction, world_size: int, args: tuple[Any, ...] = (), timeout_s: float = 120.0,
              start: str = "forkserver") -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` new gloo ranks; results in rank order.

    Ranks are forked from a server process that has imported torch and
    torchvision once (``start="forkserver"``, the default: it saves each rank
    the imports, seconds on this machine), or started as fresh interpreters
    (``start="spawn"``: each with its own Python hash seed, for tests that need
    that). Results are read while the ranks run (a rank blocked writing a large
    result cannot deadlock the join), and a rank that dies without reporting
    fails the call at once, naming its exit code.
    """
    with tempfile.TemporaryDirectory(prefix="parplan-ranks-") as scratch:
        context = mp.get_context(start)
        if start == "forkserver":
            context.set_forkserver_preload(PRELOAD)
        queue, received = context.Queue(), context.Event()
        processes = [
            context.Process(target=_entry, args=(fn, rank, world_size, f"file://{scratch}/rendezvous", queue, args,
                                                 received), daemon=True)
            for rank in range(world_size)
        ]
        for process in processes:
            process.start()
        try:
            results = _collect(queue, processes, timeout_s)
        finally:
            received.set()
            for process in processes:
                process.join(5.0)
                if process.is_alive():
                    process.kill()
        return [results[rank] for rank in range(world_size)]


def _collect(queue: Any, processes: list[Any], timeout_s: float) -> dict[int, Any]:
    deadline = time.monotonic() + timeout_s
    results: dict[int, Any] = {}
    while len(results) < len(processes):
        try:
            rank, ok, value = queue.get(timeout=0.5)
        except queue_module.Empty:
            silent = [r for r, p in enumerate(processes) if r not in results and p.exitcode not in (None, 0)]
            if silent:
                codes = {r: processes[r].exitcode for r in silent}
                raise AssertionError(f"ranks {silent} died without reporting (exit codes {codes})") from None
            if time.monotonic() > deadline:
                missing = sorted(set(range(len(processes))) - set(results))
                raise TimeoutError(f"ranks {missing} did not finish within {timeout_s} s") from None
            continue
        if not ok:
            raise AssertionError(f"rank {rank} failed:\n{value}")
        results[rank] = value
    return results


def _entry(fn: RankFunction, rank: int, world_size: int, rendezvous: str, queue: Any, args: tuple[Any, ...],
           received: Any) -> None:
    import torch

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world_size)
        dist.barrier()  # every rank connected before any may finish and close its side (a rank still meshing
        # then saw "connection closed by peer" instead of its own result)
        try:
            queue.put((rank, True, fn(rank, world_size, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # reported to the parent with the full traceback, then the rank exits
        queue.put((rank, False, traceback.format_exc()))
    received.wait(60.0)  # tensors travel as this process's shared memory: it lives until the parent has read them


def survivors(tag: str) -> list[int]:
    """Processes still running with ``PARPLAN_TEST_TAG=tag`` in their environment (ranks a test started that
    should have ended)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"PARPLAN_TEST_TAG={tag}".encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found
