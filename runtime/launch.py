"""Starting the ranks of ``parplan run``: torchrun's machinery on this host (for one node of several, too), or
acting as one rank of a job torchrun, ``mpirun`` or ``srun`` started (``processes.job`` tells which).

* Started by hand: the command checks its inputs (model, plan, ranks,
  backend — bad input exits 2 before any rank starts), then starts
  ``--nproc`` local ranks with ``torch.distributed.launcher.elastic_launch``
  (what ``torchrun --standalone`` uses: a c10d rendezvous on a free local
  port, failures reported per rank) and collects rank 0's measurement. The
  ranks are forked from a fork server that has imported torch and the runtime
  once (``runtime.rank_pool.PRELOAD``): they start in a fraction of a second
  instead of importing torch each, and share its pages (resnet18's 69-stage
  pipeline on one host needs 69 ranks); each takes the agent's environment at
  the launch (``processes.forked``). When a rank fails, the agent stops the
  others (SIGTERM, then SIGKILL) and, up to ``max_restarts`` times, starts the group again
  (``runtime.recovery`` resumes it from the last checkpoint). Each rank dies
  with the agent's process (the kernel's ``PR_SET_PDEATHSIG`` when the fork
  server, which exits with the agent, dies; and a thread polling the agent),
  so no rank outlives ``parplan run``. With :class:`Nodes` (``--nnodes N``)
  this host's agent is one of ``N``: they meet at ``--rdzv-endpoint`` (a c10d
  rendezvous, or static with ``--node-rank``) and each starts its ranks, numbered
  node by node; rank 0's node reports.
* Started by torchrun (``torchrun … --no-python parplan run …``, any
  ``--nnodes``) or by ``srun`` without MPI: every process is one rank; it
  joins the job's store (torchrun's agent's, or one rank 0 of a Slurm step
  opens at ``processes.job.slurm_rendezvous``) and runs the worker. A
  failing rank says why and exits 1: the launcher stops the others (and
  torchrun's ``--max-restarts`` starts the group again, resumed from the
  checkpoint by ``runtime.recovery`` as under our own agent).
* Started by MPI (``mpirun -n R parplan run …``, or ``srun``): every process
  is one rank. Rank and world size come from MPI through mpi4py; rank 0 picks
  a free TCP port and broadcasts the rendezvous address over MPI; each
  process then joins torch.distributed with the chosen backend (gloo, nccl, or
  mpi where torch has it) and runs the same worker. A rank that fails calls
  ``MPI_Abort`` (``abort_mpi_job``) after its message, so ``mpirun`` stops
  every rank at once instead of waiting in ``MPI_Finalize`` for a hung one.

Every process group waits at most ``RunOptions.timeout_s`` for a peer
(``init_process_group(timeout=…)``; ``runtime.groups`` passes it to each
subgroup), so a dead or hung rank makes the others fail within it, naming
where they waited (``runtime.waiting``). With backend nccl the ranks get
``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` unless it is set, so that NCCL's
watchdog hands its timeout to the rank instead of aborting the process
(``runtime.waiting`` tells why).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import sys
import time
import uuid
import warnings
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn, TypedDict

import torch.distributed as dist

from cost_models.errors import InputError
from processes.forked import die_with, server_preload, take_environment
from processes.job import ATTEMPT_VARIABLE, launcher_of, place_in_job, slurm_rendezvous
from processes.rank_failures import (
    RankFailedError,
    failure_line,
    failure_message,
    nccl_errors_raised,
    raise_nccl_errors,
)
from runtime.options import RunOptions
from runtime.rank_pool import PRELOAD
from runtime.train import worker
from runtime.waiting import RankFailure

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

__all__ = ["Nodes", "RankFailedError", "abort_mpi_job", "launch", "launch_many"]


@dataclass(frozen=True)
class Nodes:
    """This host's part of a job of several (``parplan run --nnodes``): torchrun's names and meaning."""

    count: int
    endpoint: str
    """``HOST:PORT`` where the agents meet (the c10d store's, or node 0's under a static rendezvous)."""
    node_rank: int | None = None
    """This host's node number: a static rendezvous; ``None``: c10d numbers the agents as they arrive."""
    run_id: str = "parplan"
    """What every agent of one job gives (torchrun's ``--rdzv-id``)."""


_JOIN_TIMEOUT = timedelta(minutes=5)
"""How long a rank waits in the store for the others to start: ranks start seconds apart on a loaded host,
and a rank that dies before it joins is stopped by the agent or by mpirun, so this is not ``--timeout-s``."""

_SHUTDOWN_S = 5
"""Seconds the agent waits after SIGTERM before it SIGKILLs the ranks it stops."""

_INPUT_ERRORS = ("InputError", "TraceError", "PlanError")
"""The names of ``cost_models.errors``' classes: a rank that raised one met bad input (exit 2), not a failure."""

_MONITOR_S = 0.1
"""How often the agent checks its ranks."""

_GRACE_S = 5 * _MONITOR_S
"""How long a rank that saw a peer die waits before it exits, so that the agent reports the dead one."""


def launch(options: RunOptions, nproc: int | None, backend: str, max_restarts: int = 0, *,
           nodes: Nodes | None = None) -> dict[str, Any] | None:
    """Run ``worker`` on every rank; returns rank 0's measurement here (``None`` on other ranks and nodes).

    ``max_restarts``: how often torchrun's agent may start the group again after a rank failed.
    """
    documents = launch_many([options], nproc, backend, max_restarts, nodes=nodes)
    return None if documents is None else documents[0]


def launch_many(runs: list[RunOptions], nproc: int | None, backend: str, max_restarts: int = 0, *,
                nodes: Nodes | None = None) -> list[dict[str, Any]] | None:
    """Run ``worker`` for each of ``runs`` in turn on the same ranks (one start-up for all; ``parplan validate``).

    ``nproc``: the ranks this host starts (``None`` where a launcher started this process as one rank).
    Returns rank 0's measurements in order here (``None`` on other ranks and nodes).
    """
    launcher = launcher_of()
    if launcher == "mpi":
        return _under_mpi(runs, nproc, backend)
    if launcher is not None:
        return _as_rank(runs, nproc, backend)
    assert nproc is not None
    return _elastic(runs, nproc, backend, max_restarts, nodes)


class _ShutdownOption(TypedDict, total=False):
    shutdown_timeout: int


class _RendezvousFields(TypedDict):
    min_nodes: int
    max_nodes: int
    run_id: str
    rdzv_backend: str
    rdzv_endpoint: str


class _Rendezvous(_RendezvousFields, total=False):
    """``LaunchConfig``'s node count and rendezvous (:func:`_rendezvous`)."""

    rdzv_configs: dict[str, int | None]


def _shutdown_option(config: type) -> _ShutdownOption:
    """``shutdown_timeout`` for a torch whose ``LaunchConfig`` takes it (2.14 does, 2.11 does not: its agent waits
    its own default for ranks to stop)."""
    import inspect

    return {"shutdown_timeout": _SHUTDOWN_S} if "shutdown_timeout" in inspect.signature(config).parameters else {}


def _rendezvous(nodes: Nodes | None) -> _Rendezvous:
    """``LaunchConfig``'s node count and rendezvous: this host alone, or one of ``nodes``."""
    if nodes is None:
        return {"min_nodes": 1, "max_nodes": 1, "run_id": f"parplan-{uuid.uuid4().hex[:8]}", "rdzv_backend": "c10d",
                "rdzv_endpoint": "localhost:0"}
    static = nodes.node_rank is not None
    return {"min_nodes": nodes.count, "max_nodes": nodes.count, "run_id": nodes.run_id,
            "rdzv_backend": "static" if static else "c10d", "rdzv_endpoint": nodes.endpoint,
            "rdzv_configs": {"rank": nodes.node_rank} if static else {}}


def _elastic(runs: list[RunOptions], nproc: int, backend: str, max_restarts: int,
             nodes: Nodes | None) -> list[dict[str, object]] | None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    multiprocessing.set_forkserver_preload(server_preload(PRELOAD))  # this process's fork server, started once
    config = LaunchConfig(nproc_per_node=nproc, max_restarts=max_restarts, monitor_interval=_MONITOR_S,
                          start_method="forkserver", **_rendezvous(nodes), **_shutdown_option(LaunchConfig))
    logs = [logging.getLogger(name) for name in ("torch.distributed.elastic", "torch.multiprocessing")]
    levels = [log.level for log in logs]
    for log in logs:  # a failed rank is reported in one line (_failure_line), not the agent's log
        log.setLevel(logging.CRITICAL)
    try:
        with nccl_errors_raised(backend):  # the agent passes it on to the ranks it starts
            results = elastic_launch(config, _elastic_entry)(runs, backend, os.getpid(), dict(os.environ))
    except ChildFailedError as err:
        refused = _bad_input(err)
        if refused is not None:
            raise InputError(refused) from err
        raise RankFailedError(_failure_line(err, max_restarts)) from err
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)
    documents: list[dict[str, object]] | None = results.get(0)  # keyed by global rank: rank 0's node alone has it
    return documents


def _elastic_entry(runs: list[RunOptions], backend: str, agent_pid: int,
                   environ: dict[str, str]) -> list[dict[str, object]] | None:
    take_environment(environ)  # the agent's, not the fork server's (processes.forked)
    die_with(agent_pid)
    _join_group(backend, runs[0].timeout)
    try:
        documents = _each(runs)
    except RankFailure as err:
        _fail_fast(err)
    except Exception as err:  # noqa: BLE001 - every error of a rank ends it the same way
        _exit_recorded(err)
    dist.destroy_process_group()
    return documents


def _fail_fast(err: RankFailure) -> NoReturn:
    """Say where this rank waited, record the error for the agent's report, and exit without tearing down.

    When the peer died, this rank first gives the agent ``_GRACE_S`` to see the dead one (it stops this
    rank meanwhile), so the report names the rank that died rather than the one that noticed.
    """
    print(f"parplan: {err}", file=sys.stderr, flush=True)
    _exit_recorded(err, grace_s=_GRACE_S if err.peer_died else 0.0)


def _exit_recorded(err: Exception, *, grace_s: float = 0.0) -> NoReturn:
    """Record ``err`` for the agent's report (``TORCHELASTIC_ERROR_FILE``) and exit 1 without tearing down.

    A peer may be gone or leaving: tearing down the group and the interpreter would wait on its sockets
    and threads (seconds), and gloo's destructors may abort the process (SIGABRT) on a connection the
    peer closed — the report would then name a rank's death instead of the error every rank raised
    together (a checkpoint no rank could complete). The agent only needs this process to end.
    """
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    ErrorHandler().record_exception(err)  # called while ``err`` is handled: its traceback is the current one
    if grace_s:
        time.sleep(grace_s)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _each(runs: list[RunOptions]) -> list[dict[str, object]] | None:
    """Every run's measurement on rank 0 (``None`` elsewhere)."""
    warnings.formatwarning = _one_line  # a rank's warnings (a loss taken whole) as one line each
    documents = []
    for options in runs:
        documents.append(worker(options))
        if options.progress_file and dist.get_rank() == 0:
            with open(options.progress_file, "a") as told:
                told.write("done\n")
    return None if dist.get_rank() != 0 else [d for d in documents if d is not None]


def _one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
              line: str | None = None) -> str:
    del filename, lineno, line
    return f"parplan run: warning: {message}\n" if category is UserWarning else f"{category.__name__}: {message}\n"


def _as_rank(runs: list[RunOptions], nproc: int | None, backend: str) -> list[dict[str, object]] | None:
    """This process as one rank of a job torchrun or ``srun`` started: join, run, and on a failure say why and exit."""
    place = place_in_job()
    assert place is not None
    if nproc is not None and nproc != place.world_size:
        raise InputError(f"--nproc {nproc} but {place.launcher} started {place.world_size} ranks; drop --nproc or "
                         "make them equal")
    if place.launcher == "torchrun":
        _join_group(backend, runs[0].timeout)
    else:
        os.environ.setdefault("LOCAL_RANK", str(place.local_rank))  # the rank's GPU (runtime.train)
        host, port = slurm_rendezvous()
        store = dist.TCPStore(host, port, place.world_size, is_master=place.rank == 0, timeout=_JOIN_TIMEOUT)
        raise_nccl_errors(backend)
        dist.init_process_group(backend, store=store, rank=place.rank, world_size=place.world_size,
                                timeout=runs[0].timeout)
    try:
        documents = _each([replace(options, launcher=place.launcher) for options in runs])
    except RankFailure as err:
        _fail_fast(err)
    dist.destroy_process_group()
    return documents


def _under_mpi(runs: list[RunOptions], nproc: int | None, backend: str) -> list[dict[str, object]] | None:
    try:
        from mpi4py import MPI
    except ImportError:
        raise InputError("this process was started by MPI but mpi4py is not installed; pip install mpi4py") from None
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if nproc is not None and nproc != size:
        raise InputError(f"--nproc {nproc} but mpirun started {size} ranks; drop --nproc or make them equal")
    hosts = comm.allgather(socket.gethostname())
    host, port = comm.bcast(_rendezvous_address(len(set(hosts)) == 1) if rank == 0 else None, root=0)
    store = dist.TCPStore(host, port, size, is_master=rank == 0, timeout=_JOIN_TIMEOUT)
    raise_nccl_errors(backend)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=runs[0].timeout)
    documents = _each([replace(options, launcher="mpi") for options in runs])
    dist.destroy_process_group()  # not after a RankFailure: the command's handler aborts the MPI job at once
    return documents


def _rendezvous_address(one_host: bool) -> tuple[str, int]:
    """Host and a port free on this host (rank 0's), for the store the ranks meet in."""
    host = "127.0.0.1" if one_host else socket.getfqdn()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    return host, port


def _join_group(backend: str, timeout: timedelta) -> None:
    """``init_process_group`` from torchrun's environment, with its keys under a prefix of this start of the job.

    The agents' store outlives a restart and still holds the previous start's gloo addresses: a rank
    that read them would connect to a dead peer. Every rank counts its own starts in the store (each
    rank starts once per rendezvous round), so the ranks of one round agree on its number — which
    torchrun's ``TORCHELASTIC_RESTART_COUNT`` does not give across nodes (a healthy node's agent
    restarts its ranks without counting) — and it becomes the keys' prefix and the job's attempt
    (:data:`processes.job.ATTEMPT_VARIABLE`, read by recovery and the fault schedule).
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    hosted_by_agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not hosted_by_agent and rank == 0, timeout=_JOIN_TIMEOUT, multi_tenant=True)
    starts = int(store.add(f"parplan/starts/rank-{rank}", 1))
    os.environ[ATTEMPT_VARIABLE] = str(starts - 1)
    dist.init_process_group(backend, store=dist.PrefixStore(f"parplan/start-{starts}", store), rank=rank,
                            world_size=world, timeout=timeout)


def abort_mpi_job(code: int) -> None:
    """Under an MPI launcher with more than one rank, stop every rank of the job (``MPI_Abort``) with ``code``.

    A failed rank must not exit alone: the others could wait in ``MPI_Finalize`` for a rank that hangs.
    Does nothing outside MPI, or when this process never initialised MPI.
    """
    module = sys.modules.get("mpi4py.MPI")
    if module is None or launcher_of() != "mpi":
        return
    comm = module.COMM_WORLD
    if comm.Get_size() > 1:
        sys.stderr.flush()
        comm.Abort(code)


def _failure_line(err: ChildFailedError, max_restarts: int) -> str:
    """One line for torchrun's ``ChildFailedError``: :func:`processes.rank_failures.failure_line` of its ranks."""
    return failure_line(err.failures, max_restarts)


def _bad_input(err: ChildFailedError) -> str | None:
    """The message of an InputError a rank raised (a checkpoint refused on reading it, …), if that is what failed.

    Only text crosses the process boundary (the error file's ``ExceptionType: message``), so the type is
    recognised by its name: ``cost_models.errors`` and its subclasses.
    """
    for failure in err.failures.values():
        last = failure_message(failure).splitlines()[-1] if failure_message(failure) else ""
        kind, _, text = last.partition(": ")
        if kind.rsplit(".", 1)[-1] in _INPUT_ERRORS and text:
            return text
    return None
