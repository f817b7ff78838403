"""One calibration run: time the model's local problems, then the collectives, fit both, build a Profile.

The budget is shared: compute kernels get the first ``COMPUTE_SHARE`` of it
(all of it with one rank), collectives the rest, less a reserve for fitting
and writing — and at least ``MIN_COMM_S`` even when the kernels overran their
share (the run then takes longer than its budget, and says so). A profile
that still lacks the collectives every multi-device plan is priced with says
so (``Profile.missing_parts``): in calibrate's notes, ``profile show``,
``estimate``'s warnings and the error of any plan priced from it.
Compute kernels are timed as a step runs them — every candidate
layout's layers in model order, forward then backward, with the host's other
ranks running the same kernels (``calibrate.sequences``, ``calibrate.busy``);
whatever the budget or a Ctrl-C leaves unmeasured is predicted by the fitted
model, and the profile says how many.
An interrupted run still returns a valid profile of what was measured.

Every process group of the collectives waits at most ``timeout_s`` for a peer
(``parplan calibrate --timeout-s``): a rank that dies or hangs fails the
calibration with one line naming the rank and the collective the others
waited in (``calibrate.comm_ranks``, ``processes.rank_failures``). Started
by torchrun or mpirun, the ranks wait for rank 0's kernel timings in a group
of their own whose timeout adds the budget to it.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import platform
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

import torch

from calibrate.compute_fit import fit_compute
from calibrate.problems import enumerate_problems
from cost_models.errors import InputError
from cost_models.profile import CPU_NAME_PREFIX, CommSample, ComputeSample, DeviceSpec, FitError, OptimizerFit, Profile
from processes.heap import steady_heap
from processes.job import place_in_job
from processes.rank_failures import barrier

if TYPE_CHECKING:
    from calibrate.comm_bench import CommMeasurement
    from cost_models.ir.graph import LayerGraph

logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # "no CUDA runtime" noise on CPU

__all__ = ["CalibrationRequest", "CalibrationResult", "run_calibration"]

COMPUTE_SHARE = 0.6
RESERVE_S = 2.0
MIN_COMM_S = 12.0  # starting ranks costs 4–8 s here (torch import per rank)
COMM_REPEATS = 21  # timed runs per sample, each a burst of operations (see comm_bench.ops_per_run)
COMM_SIZES_BYTES = tuple(1024 * 2**k for k in range(17))  # 1 KiB … 64 MiB, every power of two
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class CalibrationRequest:
    """What to calibrate: the traced model, device counts, ranks for collectives, budget, threads, device.

    ``timeout_s``: how long a collective of the ranks waits for a peer. ``before_measurement``: called on every
    rank as ``(rank, measurement)`` (1-based) at the start of each collective measurement — a module-level
    function, as it is pickled to spawned ranks (``parplan calibrate`` strikes ``PARPLAN_FAULT`` there).
    """

    graph: LayerGraph
    device_counts: tuple[int, ...]
    ranks: int
    budget_s: float
    threads: int
    device: str = "cpu"
    backend: str = "gloo"
    model_spec: str = ""
    comm_sizes_bytes: tuple[int, ...] | None = None
    timeout_s: float = 300.0
    before_measurement: Callable[[int, int], None] | None = None


@dataclass
class CalibrationResult:
    """The profile and what the run could not do."""

    profile: Profile
    measured: int
    left_to_fit: int
    interrupted: bool
    notes: list[str] = field(default_factory=list)


def run_calibration(request: CalibrationRequest, progress: Progress | None = None) -> CalibrationResult | None:
    """Measure compute then collectives within ``request.budget_s`` and fit the profile.

    Started by torchrun or mpirun, the process is one rank of the job: every
    rank takes part in the collectives, rank 0 also times the compute kernels
    and returns the result; the other ranks return ``None``. Otherwise
    ``request.ranks`` local ranks are spawned for the collectives.
    """
    from calibrate.comm_ranks import in_existing_group

    if in_existing_group():
        return _run_as_rank(request, progress)
    started = time.monotonic()
    deadline = started + request.budget_s - RESERVE_S
    compute_deadline = started + request.budget_s - RESERVE_S
    if request.ranks > 1:
        from calibrate.comm_ranks import check_launch

        check_launch(request.ranks, request.budget_s, request.backend)
        comm_s = max(MIN_COMM_S, request.budget_s * (1 - COMPUTE_SHARE))
        compute_deadline = started + max(request.budget_s - comm_s, 0.0) - RESERVE_S
    total = len(enumerate_problems(request.graph, request.device_counts))
    optimizers, notes = _measure_optimizers(request.graph, request.device, compute_deadline, request.threads)
    compute, interrupted, compute_notes = measure_compute(
        request.graph, request.device_counts, compute_deadline, threads=request.threads, device=request.device,
        helpers=local_helpers(request.ranks, request.threads, request.device), progress=progress)
    notes += compute_notes
    comm: list[CommSample] = []
    if request.ranks > 1 and not interrupted:
        late_s = time.monotonic() + MIN_COMM_S - deadline  # kernels overran their share: collectives still get theirs
        if late_s > 0:
            notes.append(f"the kernels overran their share of the budget: the collectives took {late_s:.0f} s more "
                         f"than --budget-s to get their least {MIN_COMM_S:.0f} s")
        comm, comm_notes, interrupted = _measure_comm(request, max(deadline, time.monotonic() + MIN_COMM_S))
        notes += comm_notes
    profile = _build_profile(request, compute, comm, time.monotonic() - started, interrupted, total, notes,
                             optimizer_fits=optimizers)
    notes += profile.missing_parts()
    return CalibrationResult(profile, len(compute), total - len(compute), interrupted, notes)


def _run_as_rank(request: CalibrationRequest, progress: Progress | None) -> CalibrationResult | None:
    import torch.distributed as dist

    from calibrate.comm_bench import default_group_sizes, measure_collectives
    from calibrate.comm_ranks import init_from_environment
    from cost_models.collectives import COLLECTIVES

    started = time.monotonic()
    joined = not dist.is_initialized()  # a group this call starts, it also ends
    job = init_from_environment(request.backend, request.timeout_s)
    # rank 0 times the kernels first while the others wait for it: longer than --timeout-s, in a group of their own
    waiting_s = request.budget_s + request.timeout_s
    waiting = dist.new_group(list(range(job.world_size)), timeout=timedelta(seconds=waiting_s))
    assert isinstance(waiting, dist.ProcessGroup), "every rank is a member of the group of all ranks"
    device = f"cuda:{job.local_rank}" if request.backend == "nccl" else request.device
    total = len(enumerate_problems(request.graph, request.device_counts))
    compute: list[ComputeSample] = []
    interrupted = False
    notes: list[str] = []
    optimizers: list[OptimizerFit] = []
    if job.rank == 0:
        compute_deadline = started + request.budget_s * COMPUTE_SHARE - RESERVE_S
        place = place_in_job()  # this node's ranks time kernels at once: as many helpers
        local_ranks = place.local_world_size if place is not None else job.world_size
        optimizers, notes = _measure_optimizers(request.graph, device, compute_deadline, request.threads)
        compute, interrupted, compute_notes = measure_compute(
            request.graph, request.device_counts, compute_deadline, threads=request.threads, device=device,
            helpers=local_helpers(local_ranks, request.threads, device), progress=progress)
        notes += compute_notes
    barrier("the wait for rank 0's kernel timings", waiting)
    comm_device = torch.device(device) if request.backend == "nccl" else torch.device("cpu")
    # the planner's most used collectives first, so a short budget still fits them
    order = sorted(COLLECTIVES, key=lambda name: (name not in ("allreduce", "sendrecv"), COLLECTIVES.index(name)))
    measured = measure_collectives(request.comm_sizes_bytes or COMM_SIZES_BYTES, default_group_sizes(job.world_size),
                                   order, started + request.budget_s - RESERVE_S, repeats=COMM_REPEATS,
                                   device=comm_device, timeout=timedelta(seconds=request.timeout_s),
                                   before_measurement=request.before_measurement)
    if joined:  # before the interpreter exits: gloo's threads must not outlive it (an abort at exit otherwise)
        barrier("the end of the collective timings")
        dist.destroy_process_group()
    if job.rank != 0:
        return None
    notes += _comm_notes(measured)  # a profile short of collectives says so (issue 52 item 4)
    in_job = CalibrationRequest(**{**request.__dict__, "ranks": job.world_size, "device": device})
    profile = _build_profile(in_job, compute, list(measured.samples), time.monotonic() - started, interrupted,
                             total, notes, optimizer_fits=optimizers)
    notes += profile.missing_parts()
    return CalibrationResult(profile, len(compute), total - len(compute), interrupted, notes)


def measure_compute(graph: LayerGraph, device_counts: Sequence[int], deadline: float, *, threads: int, device: str,
                    helpers: int = 0, progress: Progress | None = None,
                    max_problem_bytes: int | None = None) -> tuple[list[ComputeSample], bool, list[str]]:
    """Time every candidate layout's local problems in model order until the deadline (``calibrate.sequences``).

    ``helpers`` processes run the same kernels meanwhile (``calibrate.busy``): the host's other ranks. Problems
    whose tensors, times the processes running them, would not fit in ``max_problem_bytes`` (default: a quarter
    of the device's memory) are left to the fitted model. Returns the samples, whether Ctrl-C stopped it, notes.
    """
    from calibrate.busy import Busy
    from calibrate.sequences import layout_chunks, time_chunks

    torch.set_num_threads(threads)
    steady_heap()
    memory_cap = (max_problem_bytes or _device_spec(device).memory_bytes // 4) // (helpers + 1)
    chunks = layout_chunks(graph, device_counts, memory_cap)
    with Busy(chunks, helpers=helpers, threads=threads, device=device) as busy:
        samples, interrupted = time_chunks(chunks, deadline, device, busy=busy, progress=progress)
    notes = [f"kernels timed without the other ranks' load: {busy.failed}"] if busy.failed else []
    return samples, interrupted, notes


def _measure_optimizers(graph: LayerGraph, device: str, deadline: float,
                        threads: int) -> tuple[list[OptimizerFit], list[str]]:
    from calibrate.optimizer_bench import measure_optimizers

    torch.set_num_threads(threads)
    steady_heap()
    return measure_optimizers(graph, device, deadline)


def local_helpers(ranks: int, threads: int, device: str) -> int:
    """Processes to keep busy beside the timing one: the run's other ranks on this host (none on a GPU)."""
    if device.startswith("cuda") or ranks <= 1:
        return 0
    return max(0, min(ranks, (os.cpu_count() or 1) // max(threads, 1)) - 1)


def _measure_comm(request: CalibrationRequest, deadline: float) -> tuple[list[CommSample], list[str], bool]:
    from calibrate.comm_ranks import run_comm_measurement

    budget_s = deadline - time.monotonic()
    sizes = request.comm_sizes_bytes or COMM_SIZES_BYTES
    try:
        measured = run_comm_measurement(request.ranks, sizes, budget_s, backend=request.backend, repeats=COMM_REPEATS,
                                        timeout_s=request.timeout_s, before_measurement=request.before_measurement)
    except KeyboardInterrupt:
        return [], ["interrupted while timing collectives: none kept"], True
    except InputError as err:  # nothing could be timed in what was left: keep the compute results
        return [], [f"collectives not timed: {err}"], False
    return list(measured.samples), _comm_notes(measured), False


def _comm_notes(measured: CommMeasurement) -> list[str]:
    """What the collectives' timing left out: collectives skipped and why, measurements past the budget."""
    notes = [f"{name} not timed: {why}" for name, why in measured.skipped.items()]
    if measured.unfinished:
        notes.append(f"{measured.unfinished} collective measurements did not fit in the budget")
    return notes


def _build_profile(request: CalibrationRequest, compute: list[ComputeSample], comm: list[CommSample],
                   seconds: float, interrupted: bool, total: int, notes: list[str], *,
                   optimizer_fits: Sequence[OptimizerFit] = ()) -> Profile:
    from calibrate.comm_fit import fit_comm

    compute_fits, compute_error = fit_compute(compute) if compute else ([], FitError(None, None, 0))
    comm_fits, comm_error = fit_comm(comm) if comm else ([], FitError(None, None, 0))
    meta = _metadata(request, seconds) | {
        "problems_total": total, "problems_measured": len(compute), "left_to_fit": total - len(compute),
        "interrupted": interrupted, "notes": notes,
    }
    return Profile(device=_device_spec(request.device), meta=meta, compute_samples=tuple(compute),
                   compute_fits=tuple(compute_fits), comm_samples=tuple(comm), comm_fits=tuple(comm_fits),
                   compute_error=compute_error, comm_error=comm_error, optimizer_fits=tuple(optimizer_fits))


def _metadata(request: CalibrationRequest, seconds: float) -> dict[str, object]:
    return {
        "source": "measured",
        "host": socket.gethostname(),
        "device_name": _device_spec(request.device).name,
        "torch_version": torch.__version__,
        "backend": request.backend,
        "dtype": request.graph.graph["dtype"],
        **({"amp": request.graph.graph["amp"]} if request.graph.graph.get("amp") else {}),
        "threads_per_rank": request.threads,
        "ranks": request.ranks,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "calibration_s": round(seconds, 3),
        "model": request.model_spec,
        "input_shape": list(request.graph.graph["input_shape"]),
        "device_counts": list(request.device_counts),
    }


def _device_spec(device: str) -> DeviceSpec:
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        return DeviceSpec(props.name, int(props.total_memory))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return DeviceSpec(f"{CPU_NAME_PREFIX}{_cpu_name()} ({os.cpu_count()} cores)", int(memory))


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
