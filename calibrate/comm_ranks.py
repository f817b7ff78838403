"""Running the collective measurement on R local ranks, or inside a job torchrun or MPI started.

Two ways in:

* :func:`run_comm_calibration` (and :func:`run_comm_measurement`, which also
  returns what was skipped) from a plain process: spawns ``ranks`` processes
  (spawn context, ``torch.set_num_threads(1)`` in each), which meet through a
  file store in a fresh temporary directory (no ports), run
  :func:`calibrate.comm_bench.measure_collectives` and hand rank 0's result
  back over a queue read while they run. Every group waits at most
  ``timeout_s`` for a peer (``parplan calibrate --timeout-s``; joining, which
  waits for the others to start, has :data:`_JOIN_S`), so a rank whose peer
  hung fails within it, naming the collective it waited in
  (:class:`processes.rank_failures.RankFailure`), and exits 1. A rank that
  fails or dies stops the call at once (:class:`CommCalibrationError`): one
  line as ``parplan run`` reports its ranks
  (:func:`processes.rank_failures.failure_line`: ``rank 1 died (SIGKILL)``,
  ``rank 0 failed (exit code 1): RankFailure: rank 0: timed out after 4 s …``),
  gathered for :data:`_GRACE_S` after the first sign, then the ranks'
  tracebacks. With nccl each rank gets ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2``
  unless it is set (``runtime.waiting`` tells why).
* :func:`init_from_environment` when this process is one rank of a job
  started by torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``MASTER_ADDR``, ``MASTER_PORT``) or by mpirun/srun (rank and size from
  ``MPI.COMM_WORLD``; rank 0 broadcasts its host name and a free port, unless
  ``MASTER_ADDR`` and ``MASTER_PORT`` are set already), or by ``srun`` without
  MPI (``SLURM_PROCID``, ``SLURM_NTASKS``; rank 0 opens the store at
  ``processes.job.slurm_rendezvous``). mpi4py is imported only on the MPI
  path.

Assumptions: spawned ranks all run on this host, so the parent's wall clock
(``time.time()``) is theirs and the budget, which counts from the call,
pays for their start-up; with nccl, spawned rank ``r`` uses GPU ``r`` and a
launched rank its local rank's GPU.
"""

from __future__ import annotations

import os
import queue as queue_module
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from calibrate.comm_bench import DEFAULT_SIZES_BYTES, CommMeasurement, default_group_sizes, measure_collectives
from cost_models.collectives import COLLECTIVES
from cost_models.errors import InputError
from cost_models.profile import CommSample
from processes.heap import steady_heap
from processes.job import MPI_ENVIRONMENT, integer_variable, launcher_of, place_in_job, slurm_rendezvous
from processes.rank_failures import (
    LOST,
    RankExit,
    RankFailedError,
    RankFailure,
    barrier,
    failure_line,
    raise_nccl_errors,
)

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess
    from multiprocessing.queues import Queue
    from types import ModuleType

    from mpi4py import MPI

__all__ = [
    "CommCalibrationError", "RankEnvironment", "check_launch", "in_existing_group", "init_from_environment",
    "run_comm_calibration", "run_comm_measurement",
]

SPAWN_BACKENDS = ("gloo", "nccl")
_TEARDOWN_MARGIN_S = 1.0  # kept from the budget for tearing the ranks down
_WAIT_GRACE_S = 120.0  # beyond the budget and the groups' timeout, before the parent counts ranks as hung
_POLL_S = 0.2
_JOIN_S = 300.0
"""How long a spawned rank waits for the others to start (seconds apart on a loaded host): not ``timeout_s``."""
_GRACE_S = 1.0
"""After the first failed or dead rank, how long the parent waits for the others' reports and exits."""


class CommCalibrationError(RankFailedError):
    """A spawned rank failed, died or hung; the first line names the rank and why, as ``parplan run``'s do."""


@dataclass(frozen=True)
class RankEnvironment:
    """This process's place in the job :func:`init_from_environment` joined."""

    rank: int
    world_size: int
    local_rank: int
    launcher: str  # "torchrun", "mpi", "slurm" or "existing" (a group was already initialised)


@dataclass(frozen=True)
class _RankTask:
    """Everything a spawned rank needs (picklable)."""

    world_size: int
    backend: str
    store_path: str
    deadline_wall_s: float
    sizes_bytes: tuple[int, ...]
    collectives: tuple[str, ...]
    repeats: int
    warmup: int
    timeout_s: float
    """How long a group waits for a peer."""
    wait_s: float
    """How long the parent waits for every rank's report."""
    before_measurement: Callable[[int, int], None] | None = None
    """Called on every rank before each measurement (module-level, so that it pickles)."""


class _Report(NamedTuple):
    """What a spawned rank puts on the parent's queue once: its measurement (rank 0's) or how it failed."""

    rank: int
    measurement: CommMeasurement | None
    """Rank 0's result when it finished (``None`` from the other ranks)."""
    failure: tuple[str, str] | None
    """``ExceptionType: message`` and the traceback, when it failed (``None`` when it finished)."""


def run_comm_calibration(
    ranks: int, sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES, budget_s: float = 60.0, backend: str = "gloo"
) -> list[CommSample]:
    """Time collectives on ``ranks`` spawned local ranks within ``budget_s``; rank 0's samples.

    See :func:`run_comm_measurement` for the arguments and errors.
    """
    return list(run_comm_measurement(ranks, sizes_bytes, budget_s, backend).samples)


def run_comm_measurement(
    ranks: int,
    sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
    budget_s: float = 60.0,
    backend: str = "gloo",
    *,
    collectives: Sequence[str] = COLLECTIVES,
    repeats: int = 5,
    warmup: int = 2,
    timeout_s: float | None = None,
    before_measurement: Callable[[int, int], None] | None = None,
) -> CommMeasurement:
    """Spawn ``ranks`` processes, time collectives on groups of 2, 4, …, ``ranks`` of them, return rank 0's result.

    Args:
        ranks: Processes to spawn (>= 2).
        sizes_bytes: Message sizes (see :mod:`cost_models.collectives` for their meaning).
        budget_s: Wall seconds for the whole call, start-up of the ranks included.
        backend: ``gloo`` (CPU) or ``nccl`` (rank ``r`` on GPU ``r``).
        collectives: Which collectives to time.
        repeats: Timed runs per sample.
        warmup: Untimed runs before them.
        timeout_s: How long any collective of the ranks waits for a peer (default: the budget and 120 s).
        before_measurement: Called in every rank as ``before_measurement(rank, measurement)`` (1-based) at the
            start of each planned measurement (a module-level function: it is pickled to the ranks).

    Raises:
        InputError: The ranks cannot start (too few, backend or GPUs missing) or
            the budget ran out before anything was timed.
        CommCalibrationError: A rank failed, died or hung.
    """
    check_launch(ranks, budget_s, backend)
    _check_request(sizes_bytes, collectives, repeats, warmup)
    deadline_wall_s = time.time() + budget_s - min(_TEARDOWN_MARGIN_S, 0.05 * budget_s)
    group_timeout_s = budget_s + _WAIT_GRACE_S if timeout_s is None else timeout_s
    with tempfile.TemporaryDirectory(prefix="parplan-comm-") as scratch:
        task = _RankTask(
            ranks, backend, f"{scratch}/rendezvous", deadline_wall_s, tuple(int(s) for s in sizes_bytes),
            tuple(collectives), repeats, warmup, group_timeout_s, budget_s + _WAIT_GRACE_S + group_timeout_s,
            before_measurement,
        )
        measurement = _spawn_and_collect(task)
    if not measurement.samples:
        raise InputError(_nothing_timed(measurement, ranks, budget_s))
    return measurement


def check_launch(ranks: int, budget_s: float, backend: str) -> None:
    """Refuse, with one clear line, a launch that cannot work (too few ranks, missing backend or GPUs)."""
    if ranks < 2:
        raise InputError(f"timing collectives needs at least 2 ranks, got {ranks}; ask for 2 or more")
    if budget_s <= 0:
        raise InputError(f"the time budget must be positive, got {budget_s} s")
    if backend not in SPAWN_BACKENDS:
        raise InputError(f"backend {backend!r} cannot run spawned local ranks; use one of {', '.join(SPAWN_BACKENDS)}")
    if not dist.is_available() or (backend == "gloo" and not dist.is_gloo_available()):
        raise InputError(f"this torch build has no {backend} backend for torch.distributed; install one that has")
    if backend == "nccl" and (not dist.is_nccl_available() or torch.cuda.device_count() < ranks):
        raise InputError(
            f"nccl with {ranks} ranks needs {ranks} GPUs, this machine has {torch.cuda.device_count()}; "
            "use fewer ranks or backend gloo"
        )


def _check_request(sizes_bytes: Sequence[int], collectives: Sequence[str], repeats: int, warmup: int) -> None:
    unknown = [c for c in collectives if c not in COLLECTIVES]
    if unknown or not collectives:
        raise InputError(f"unknown or no collectives {list(collectives)}; choose from {', '.join(COLLECTIVES)}")
    if not sizes_bytes or min(sizes_bytes) <= 0:
        raise InputError(f"message sizes must be positive and non-empty, got {list(sizes_bytes)}")
    if repeats < 1 or warmup < 0:
        raise InputError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")


def _nothing_timed(measurement: CommMeasurement, ranks: int, budget_s: float) -> str:
    if measurement.skipped:
        refused = "; ".join(f"{c}: {why}" for c, why in measurement.skipped.items())
        return f"no collective could be timed on {ranks} ranks ({measurement.backend} refused {refused})"
    return (
        f"no collective could be timed: the budget of {budget_s:g} s ran out while {ranks} ranks started; "
        "give a larger budget (at least 10 s)"
    )


def _spawn_and_collect(task: _RankTask) -> CommMeasurement:
    context = mp.get_context("spawn")
    results: Queue[_Report] = context.Queue()
    processes = [
        context.Process(target=_rank_main, args=(task, rank, results), daemon=True, name=f"parplan-comm-rank{rank}")
        for rank in range(task.world_size)
    ]
    finished = False
    try:
        _start(processes)
        measurement = _collect(results, processes, task.wait_s)
        finished = True
    finally:
        _stop(processes, graceful=finished)
    return measurement


def _start(processes: Sequence[BaseProcess]) -> None:
    for process in processes:
        try:
            process.start()
        except OSError as error:
            raise InputError(f"could not start {len(processes)} ranks: {error}") from error


def _stop(processes: Sequence[BaseProcess], graceful: bool) -> None:
    """Join finished ranks; on failure kill the rest at once (they may wait in a collective)."""
    for process in processes:
        if process.pid is None:
            continue
        if not graceful and process.is_alive():
            process.kill()
        process.join(10.0 if graceful else 1.0)
        if process.is_alive():
            process.kill()
            process.join(1.0)


def _collect(results: Queue[_Report], processes: Sequence[BaseProcess], wait_s: float) -> CommMeasurement:
    """Read every rank's report while they run; rank 0's measurement."""
    deadline_s = time.monotonic() + wait_s
    pending = set(range(len(processes)))
    measurement: CommMeasurement | None = None
    while pending:
        try:
            report = results.get(timeout=_POLL_S)
        except queue_module.Empty:
            if any(processes[rank].exitcode not in (None, 0) for rank in pending):
                raise _failure(results, processes, {}) from None
            if time.monotonic() > deadline_s:
                raise CommCalibrationError(f"ranks {sorted(pending)} did not finish within {wait_s:g} s") from None
            continue
        if report.failure is not None:
            raise _failure(results, processes, {report.rank: (time.time(), *report.failure)})
        pending.discard(report.rank)
        measurement = report.measurement if report.rank == 0 else measurement
    if measurement is None:
        raise CommCalibrationError("rank 0 finished without a measurement")
    return measurement


def _failure(results: Queue[_Report], processes: Sequence[BaseProcess],
             reports: dict[int, tuple[float, str, str]]) -> CommCalibrationError:
    """Every failed rank's end in one line (``failure_line``), then their tracebacks.

    ``reports``: rank → (when, ``ExceptionType: message``, traceback) of the failures reported so far. The
    others' reports and exits are gathered for ``_GRACE_S`` first. A rank that reports a lost peer counts as
    failing ``_GRACE_S`` later (as ``parplan run``'s ranks wait that long before they exit), so a peer that
    exited by itself meanwhile is named first; one killed by a signal is named first anyway.
    """
    ended: dict[int, float] = {}
    settle_s = time.monotonic() + _GRACE_S
    while True:
        for rank, process in enumerate(processes):
            if process.exitcode not in (None, 0):
                ended.setdefault(rank, time.time())
        if time.monotonic() >= settle_s or all(process.exitcode is not None for process in processes):
            break
        try:
            report = results.get(timeout=_POLL_S)
        except queue_module.Empty:
            continue
        if report.failure is not None:
            reports.setdefault(report.rank, (time.time(), *report.failure))
    failures: dict[int, RankExit] = {}
    for rank, process in enumerate(processes):
        code = process.exitcode
        if rank in reports:  # a rank that reported exits 1 (``_rank_main``)
            seen, line, _ = reports[rank]
            failures[rank] = RankExit(code if code not in (None, 0) else 1, seen + (_GRACE_S if LOST in line else 0),
                                      line)
        elif rank in ended:
            failures[rank] = RankExit(code, ended[rank])
    traces = "\n".join(trace for _, _, trace in reports.values())
    return CommCalibrationError(failure_line(failures) + (f"\n{traces}" if traces else ""))


def _rank_main(task: _RankTask, rank: int, results: Queue[_Report]) -> None:
    """Body of one spawned rank: join the group, measure, report (rank 0 its result, others None).

    A failure is reported as ``ExceptionType: message`` and its traceback; then the rank exits 1 at once, without
    tearing the group down (a peer may be gone; the parent stops the others).
    """
    torch.set_num_threads(1)
    steady_heap()
    phase = "joining the process group"
    try:
        device = _spawned_device(task.backend, rank)
        raise_nccl_errors(task.backend)
        _join(task, rank)
        phase = "timing collectives"
        measurement = _measure(task, device)
        barrier("the end of the collective timings")
        results.put(_Report(rank, measurement if rank == 0 else None, None))
        dist.destroy_process_group()
    except BaseException as err:  # reported to the parent, which names it in one line; the rank then exits 1
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        line = f"{type(err).__name__}: {first}" + ("" if isinstance(err, RankFailure) else f" (while {phase})")
        results.put(_Report(rank, None, (line, traceback.format_exc())))
        results.close()
        results.join_thread()  # the report is in the pipe before the process ends
        os._exit(1)


def _join(task: _RankTask, rank: int) -> None:
    """Wait up to ``_JOIN_S`` for every rank to start, then form the default group with ``task.timeout_s``."""
    store = dist.FileStore(task.store_path, task.world_size)
    store.set_timeout(timedelta(seconds=_JOIN_S))
    store.set(f"parplan/started/{rank}", "1")
    store.wait([f"parplan/started/{r}" for r in range(task.world_size)], timedelta(seconds=_JOIN_S))
    dist.init_process_group(task.backend, store=store, rank=rank, world_size=task.world_size,
                            timeout=timedelta(seconds=task.timeout_s))


def _spawned_device(backend: str, rank: int) -> torch.device:
    if backend == "nccl":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def _measure(task: _RankTask, device: torch.device) -> CommMeasurement:
    deadline_s = time.monotonic() + (task.deadline_wall_s - time.time())
    return measure_collectives(
        task.sizes_bytes, default_group_sizes(task.world_size), task.collectives, deadline_s,
        repeats=task.repeats, warmup=task.warmup, device=device, timeout=timedelta(seconds=task.timeout_s),
        before_measurement=task.before_measurement,
    )


def in_existing_group(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started as one rank of a job by torchrun, an MPI launcher or ``srun``."""
    return launcher_of(environ) is not None


def init_from_environment(backend: str = "gloo", timeout_s: float = 1800.0) -> RankEnvironment:
    """Initialise the default process group from torchrun's or MPI's environment.

    With nccl, the rank's GPU (its local rank) is selected first, and NCCL's
    errors are left to the rank (``raise_nccl_errors``; torchrun sets its own
    value, which is kept). Returns at once, describing the group, when one is
    initialised already.

    Raises:
        InputError: Not started by torchrun or MPI, a variable is missing or
            malformed, or mpi4py is needed but not installed.
    """
    env = os.environ
    timeout = timedelta(seconds=timeout_s)
    if dist.is_available() and dist.is_initialized():
        return RankEnvironment(dist.get_rank(), dist.get_world_size(), integer_variable(env, "LOCAL_RANK", 0),
                               "existing")
    raise_nccl_errors(backend)
    launcher = launcher_of(env)
    if launcher == "torchrun":
        return _init_torchrun(backend, env, timeout)
    if launcher == "mpi":
        return _init_mpi(backend, timeout)
    if launcher == "slurm":
        return _init_slurm(backend, timeout)
    raise InputError(
        "this process was not started by torchrun, mpirun or srun (none of RANK/WORLD_SIZE, "
        f"{', '.join(MPI_ENVIRONMENT)}, SLURM_PROCID is set); launch it with one, or spawn local ranks instead"
    )


def _init_torchrun(backend: str, env: Mapping[str, str], timeout: timedelta) -> RankEnvironment:
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
    if missing:
        raise InputError(f"RANK and WORLD_SIZE are set but {' and '.join(missing)} not; start the job with torchrun")
    rank, world_size = integer_variable(env, "RANK"), integer_variable(env, "WORLD_SIZE")
    local_rank = integer_variable(env, "LOCAL_RANK", 0)
    _select_device(backend, local_rank)
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, timeout=timeout)
    return RankEnvironment(rank, world_size, local_rank, "torchrun")


def _init_slurm(backend: str, timeout: timedelta) -> RankEnvironment:
    place = place_in_job()
    assert place is not None
    host, port = slurm_rendezvous()
    _select_device(backend, place.local_rank)
    store = dist.TCPStore(host, port, place.world_size, is_master=place.rank == 0, timeout=timedelta(seconds=_JOIN_S))
    dist.init_process_group(backend, store=store, rank=place.rank, world_size=place.world_size, timeout=timeout)
    return RankEnvironment(place.rank, place.world_size, place.local_rank, "slurm")


def _init_mpi(backend: str, timeout: timedelta) -> RankEnvironment:
    try:
        from mpi4py import MPI  # imported lazily: only MPI-launched jobs need it
    except ImportError:
        raise InputError("started by an MPI launcher but mpi4py is not installed; pip install mpi4py") from None
    comm = MPI.COMM_WORLD
    rank, world_size = comm.Get_rank(), comm.Get_size()
    local_rank = _mpi_local_rank(comm, MPI)
    _select_device(backend, local_rank)
    if backend == "mpi":
        dist.init_process_group("mpi", timeout=timeout)
        return RankEnvironment(rank, world_size, local_rank, "mpi")
    host, port = comm.bcast(_master_address() if rank == 0 else None, root=0)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = str(host), str(port)
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, timeout=timeout)
    return RankEnvironment(rank, world_size, local_rank, "mpi")


def _mpi_local_rank(comm: MPI.Intracomm, mpi: ModuleType) -> int:
    """Index of this rank among the ranks on its host."""
    shared = comm.Split_type(mpi.COMM_TYPE_SHARED)
    try:
        return int(shared.Get_rank())
    finally:
        shared.Free()


def _master_address() -> tuple[str, int]:
    """``MASTER_ADDR``/``MASTER_PORT`` if both are set, else this host's name and a free port."""
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return os.environ["MASTER_ADDR"], integer_variable(os.environ, "MASTER_PORT")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return socket.gethostname(), int(probe.getsockname()[1])


def _select_device(backend: str, local_rank: int) -> None:
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
