"""Tier-3 test base: spawn ``world_size`` CPU ranks with gloo and collect what each returns.

Usage::

    results = run_ranks(my_rank_function, world_size=2, args=(...,))

``my_rank_function(rank, world_size, *args)`` runs inside an initialised
default process group (gloo, ``file://`` rendezvous in a fresh temporary
directory) and returns something picklable; ``run_ranks`` returns the list of
results in rank order, and re-raises the first rank's failure with its
traceback. Functions must be importable at module level (spawn pickles them).
"""

from __future__ import annotations

import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["run_ranks"]

RankFunction = Callable[..., Any]


def run_ranks(fn: RankFunction, world_size: int, args: tuple[Any, ...] = (), timeout_s: float = 120.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned gloo ranks; results in rank order."""
    with tempfile.TemporaryDirectory(prefix="parplan-ranks-") as scratch:
        rendezvous = Path(scratch) / "rendezvous"
        context = mp.get_context("spawn")
        queue = context.SimpleQueue()
        processes = [
            context.Process(target=_entry, args=(fn, rank, world_size, str(rendezvous), queue, args), daemon=True)
            for rank in range(world_size)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout_s)
        stuck = [rank for rank, process in enumerate(processes) if process.is_alive()]
        for process in processes:
            if process.is_alive():
                process.kill()
        if stuck:
            raise TimeoutError(f"ranks {stuck} did not finish within {timeout_s} s")
        results: dict[int, Any] = {}
        while not queue.empty():
            rank, ok, value = queue.get()
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = value
        missing = sorted(set(range(world_size)) - set(results))
        if missing:
            codes = [process.exitcode for process in processes]
            raise AssertionError(f"ranks {missing} returned nothing (exit codes {codes})")
        return [results[rank] for rank in range(world_size)]


def _entry(fn: RankFunction, rank: int, world_size: int, rendezvous: str, queue: Any, args: tuple[Any, ...]) -> None:
    import torch

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size)
        try:
            queue.put((rank, True, fn(rank, world_size, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # reported to the parent with the full traceback, then the rank exits
        queue.put((rank, False, traceback.format_exc()))
