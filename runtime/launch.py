"""Starting the ranks of ``parplan run``: torchrun's machinery on one host, or the ranks ``mpirun``/``srun`` started.

* Started by hand: the command checks its inputs (model, plan, ranks,
  backend — bad input exits 2 before any rank starts), then starts
  ``--nproc`` local ranks with ``torch.distributed.launcher.elastic_launch``
  (what ``torchrun --standalone`` uses: a c10d rendezvous on a free local
  port, spawned processes, failures reported per rank) and collects rank 0's
  measurement.
* Started by MPI (``mpirun -n R parplan run …``, or ``srun``): every process
  is one rank. Rank and world size come from MPI through mpi4py; rank 0 picks
  a free TCP port and broadcasts the rendezvous address over MPI; each
  process then joins torch.distributed with the chosen backend (gloo, nccl, or
  mpi where torch has it) and runs the same worker.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

import torch.distributed as dist

from cost_models.errors import InputError
from runtime.train import RunOptions, worker

__all__ = ["MPI_ENVIRONMENT", "launch", "launch_many", "started_by_mpi"]

MPI_ENVIRONMENT = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
"""Variables set by Open MPI, MPICH/Intel MPI (PMI), PMIx launchers (srun) and MVAPICH in every rank."""


def started_by_mpi() -> bool:
    """Whether this process is one rank of an MPI job (``mpirun``, ``srun`` with PMI/PMIx)."""
    return any(name in os.environ for name in MPI_ENVIRONMENT)


def launch(options: RunOptions, nproc: int | None, backend: str) -> dict[str, Any] | None:
    """Run ``worker`` on every rank; returns rank 0's measurement here (``None`` on other MPI ranks)."""
    documents = launch_many([options], nproc, backend)
    return None if documents is None else documents[0]


def launch_many(runs: list[RunOptions], nproc: int | None, backend: str) -> list[dict[str, Any]] | None:
    """Run ``worker`` for each of ``runs`` in turn on the same ranks (one start-up for all; ``parplan validate``).

    Returns rank 0's measurements in order here (``None`` on other MPI ranks).
    """
    if started_by_mpi():
        return _under_mpi(runs, nproc, backend)
    assert nproc is not None
    return _elastic(runs, nproc, backend)


def _elastic(runs: list[RunOptions], nproc: int, backend: str) -> list[dict[str, Any]]:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"parplan-{uuid.uuid4().hex[:8]}",
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1,
                          start_method="spawn")
    try:
        results = elastic_launch(config, _elastic_entry)(runs, backend)
    except ChildFailedError as err:
        raise RuntimeError(_failure_line(err)) from err
    return results[0]


def _elastic_entry(runs: list[RunOptions], backend: str) -> list[dict[str, Any]] | None:
    dist.init_process_group(backend)
    try:
        return _each(runs)
    finally:
        dist.destroy_process_group()


def _each(runs: list[RunOptions]) -> list[dict[str, Any]] | None:
    """Every run's measurement on rank 0 (``None`` elsewhere)."""
    documents = [worker(options) for options in runs]
    return None if dist.get_rank() != 0 else [d for d in documents if d is not None]


def _under_mpi(runs: list[RunOptions], nproc: int | None, backend: str) -> list[dict[str, Any]] | None:
    try:
        from mpi4py import MPI
    except ImportError:
        raise InputError("this process was started by MPI but mpi4py is not installed; pip install mpi4py") from None
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if nproc is not None and nproc != size:
        raise InputError(f"--nproc {nproc} but mpirun started {size} ranks; drop --nproc or make them equal")
    hosts = comm.allgather(socket.gethostname())
    address = comm.bcast(_rendezvous_address(len(set(hosts)) == 1) if rank == 0 else None, root=0)
    dist.init_process_group(backend, init_method=address, rank=rank, world_size=size)
    try:
        return _each([RunOptions(**{**options.__dict__, "launcher": "mpi"}) for options in runs])
    finally:
        dist.destroy_process_group()


def _rendezvous_address(one_host: bool) -> str:
    """``tcp://host:port`` with a port free on this host (rank 0's)."""
    host = "127.0.0.1" if one_host else socket.getfqdn()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    return f"tcp://{host}:{port}"


def _failure_line(err: Any) -> str:
    """One line naming the first failed rank, its exit code and its error."""
    rank, failure = min(err.failures.items()) if err.failures else (-1, None)
    if failure is None:
        return "a rank failed without a report"
    message = failure.message if isinstance(failure.message, str) else str(failure.message)
    last = message.strip().splitlines()[-1] if message.strip() else f"exit code {failure.exitcode}"
    return f"rank {rank} failed (exit code {failure.exitcode}): {last}"
