"""How many of a host's ranks can compute at once: the cores they share, which the cost model's bound needs.

``cost_models.estimate`` bounds an iteration by the work all of a host's ranks need over the ranks that can
compute at once (``Cluster``'s shared cores); this module reads that number off the host.
"""

from __future__ import annotations

import os

from processes.job import launcher_of

__all__ = ["host_shared_cores", "shared_cores"]


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
