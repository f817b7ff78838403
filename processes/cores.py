"""A host's cores and its ranks: how many can compute at once, and each rank's own cores.

``cost_models.estimate`` bounds an iteration by the work all of a host's ranks need over the ranks that can
compute at once (``Cluster``'s shared cores); :func:`host_shared_cores` reads that number off the host.

:func:`pin_rank` binds each local rank, all its threads (gloo's included), to cores of its own. Unbound, each
rank's compute thread spent ~10 % of its CPU time runnable but not running (``/proc/…/schedstat``) while gloo's
threads woke ~2,000 times a step — likely placed by the kernel near their waker, on the other rank's busy
core — and every exchange of a spatial split (resnet18's ``h2``: ~77 a step) is a point where the ranks wait
for each other. On the 2-core VM (2026-12-08, resnet18 8×3×256², 2 ranks × 1 thread, ``parplan run --steps
6``, unbound and bound runs interleaved): bound from outside with ``taskset``, 2 rounds, ``h2`` 1021, 1064 ms
unbound against 931, 967 ms bound, ``n2`` 761, 740 against 749, 736 ms; bound by this function against the
tree before it, 3 rounds, ``h2`` 1070, 1013, 1167 against 1024, 1013, 1003 ms, ``n2`` 717, 729, 704 against
726, 679, 719 ms.

Assumptions: the cores a process may use (``sched_getaffinity``) are the host's for all its local ranks, the same
for each; where they cannot give every rank ``threads`` cores of its own (more ranks × threads than cores), or a
launcher bound the ranks already (each sees fewer), nothing is bound. MPI's ranks are bound by ``mpirun``'s own
``--bind-to``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from processes.job import launcher_of

__all__ = ["host_shared_cores", "pin_rank", "shared_cores", "unpinned"]

_BEFORE_PINNING: set[int] | None = None
"""The cores this process could use before :func:`pin_rank` bound it (``None``: not bound)."""


def shared_cores(ranks_per_host: int, threads_per_rank: int, cores: int) -> float | None:
    """How many of the host's ranks can compute at once (``cores / threads``), or ``None`` when cores are left.

    ``cost_models.estimate`` then bounds the iteration by the work all ranks need over that number. A host whose
    ranks fill every core (``ranks · threads ≥ cores``) shares them: communication (gloo's copies and sums, the
    network stack) runs on the same cores as the compute it was meant to overlap.
    """
    if cores < 1 or threads_per_rank < 1 or ranks_per_host < 1:
        raise ValueError(f"ranks {ranks_per_host}, threads {threads_per_rank} and cores {cores} must be positive")
    return cores / threads_per_rank if ranks_per_host * threads_per_rank >= cores else None


def host_shared_cores(ranks: int, threads: int | None) -> float | None:
    """How many of ``ranks`` local ranks (``threads`` each, default cores / ranks) can compute at once here.

    ``None`` when all can, under MPI, whose ranks may span hosts (:func:`shared_cores`), and when
    each rank has a GPU of its own.
    """
    import torch

    if launcher_of() == "mpi" or (torch.cuda.is_available() and torch.cuda.device_count() >= ranks):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return shared_cores(ranks, threads or max(1, (os.cpu_count() or 1) // ranks), cores)


def pin_rank(local_rank: int, local_ranks: int, threads: int) -> tuple[int, ...] | None:
    """Bind every thread of this process (and those it starts later) to local rank ``local_rank``'s share of
    the cores it may use: share ``local_rank`` of ``local_ranks`` equal, contiguous shares; the cores, or
    ``None`` where nothing was bound (module docstring: too few cores, bound already, no affinity on this OS).
    Idempotent."""
    global _BEFORE_PINNING
    if not hasattr(os, "sched_setaffinity") or not 0 <= local_rank < local_ranks:
        return None
    allowed = sorted(_BEFORE_PINNING if _BEFORE_PINNING is not None else os.sched_getaffinity(0))
    share = len(allowed) // local_ranks
    if share < max(threads, 1):
        return None
    cores = allowed[local_rank * share:(local_rank + 1) * share]
    _bind_threads(set(cores))
    _BEFORE_PINNING = set(allowed)
    return tuple(cores)


@contextmanager
def unpinned() -> Iterator[None]:
    """This process's threads on every core it could use before :func:`pin_rank` for the duration (a rank that
    works while its host's other ranks wait for it); bound again after. Nothing changes where it was not bound."""
    before, own = _BEFORE_PINNING, os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if before is None or own is None:
        yield
        return
    _bind_threads(before)
    try:
        yield
    finally:
        _bind_threads(own)


def _bind_threads(cores: set[int]) -> None:
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cores)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile; one we may not move
            pass
