"""One calibration run: time the model's local problems, then the collectives, fit both, build a Profile.

The budget is shared: compute kernels get the first ``COMPUTE_SHARE`` of it
(all of it with one rank), collectives the rest, less a reserve for fitting
and writing. Problems are measured most important first
(``calibrate.problems.schedule``); whatever the budget or a Ctrl-C leaves
unmeasured is predicted by the fitted model, and the profile says how many.
An interrupted run still returns a valid profile of what was measured.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import platform
import socket
import time
from math import prod
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from calibrate.compute_fit import fit_compute
from calibrate.problems import Measurement, enumerate_problems, schedule
from cost_models.errors import InputError
from cost_models.profile import CommSample, ComputeSample, DeviceSpec, FitError, Profile

logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # "no CUDA runtime" noise on CPU

__all__ = ["CalibrationRequest", "CalibrationResult", "run_calibration"]

COMPUTE_SHARE = 0.6
RESERVE_S = 2.0
MIN_COMM_S = 12.0  # starting ranks costs 4–8 s here (torch import per rank)
COMM_REPEATS = 21  # timed runs per sample, each a burst of operations (see comm_bench.ops_per_run)
COMM_SIZES_BYTES = tuple(1024 * 2**k for k in range(17))  # 1 KiB … 64 MiB, every power of two
MAX_RUN_TIME_S = 0.25
MIN_RUN_TIME_S = 0.01
ROUGH_FLOPS_PER_S = 1e9  # before any kernel is timed: a slow CPU core, so big problems wait their turn
ROUGH_BYTES_PER_S = 1e9
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class CalibrationRequest:
    """What to calibrate: the traced model, device counts, ranks for collectives, budget, threads, device."""

    graph: Any
    device_counts: tuple[int, ...]
    ranks: int
    budget_s: float
    threads: int
    device: str = "cpu"
    backend: str = "gloo"
    model_spec: str = ""
    comm_sizes_bytes: tuple[int, ...] | None = None


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
    measurements = schedule(enumerate_problems(request.graph, request.device_counts))
    compute, interrupted = measure_compute(measurements, compute_deadline, request.threads, request.device, progress)
    notes: list[str] = []
    comm: list[CommSample] = []
    if request.ranks > 1 and not interrupted:
        comm, comm_notes, interrupted = _measure_comm(request, deadline)
        notes += comm_notes
    profile = _build_profile(request, compute, comm, time.monotonic() - started, interrupted, len(measurements), notes)
    return CalibrationResult(profile, len(compute), len(measurements) - len(compute), interrupted, notes)


def _run_as_rank(request: CalibrationRequest, progress: Progress | None) -> CalibrationResult | None:
    import torch.distributed as dist

    from calibrate.comm_bench import default_group_sizes, measure_collectives
    from calibrate.comm_ranks import init_from_environment
    from cost_models.collectives import COLLECTIVES

    started = time.monotonic()
    job = init_from_environment(request.backend)
    device = f"cuda:{job.local_rank}" if request.backend == "nccl" else request.device
    measurements = schedule(enumerate_problems(request.graph, request.device_counts))
    compute: list[ComputeSample] = []
    interrupted = False
    if job.rank == 0:
        compute_deadline = started + request.budget_s * COMPUTE_SHARE - RESERVE_S
        compute, interrupted = measure_compute(measurements, compute_deadline, request.threads, device, progress)
    dist.barrier()
    comm_device = torch.device(device) if request.backend == "nccl" else torch.device("cpu")
    # the planner's most used collectives first, so a short budget still fits them
    order = sorted(COLLECTIVES, key=lambda name: (name not in ("allreduce", "sendrecv"), COLLECTIVES.index(name)))
    measured = measure_collectives(request.comm_sizes_bytes or COMM_SIZES_BYTES, default_group_sizes(job.world_size),
                                   order, started + request.budget_s - RESERVE_S, repeats=COMM_REPEATS,
                                   device=comm_device)
    if job.rank != 0:
        return None
    notes = [f"{name} not timed: {why}" for name, why in measured.skipped.items()]
    in_job = CalibrationRequest(**{**request.__dict__, "ranks": job.world_size, "device": device})
    profile = _build_profile(in_job, compute, list(measured.samples), time.monotonic() - started, interrupted,
                             len(measurements), notes)
    return CalibrationResult(profile, len(compute), len(measurements) - len(compute), interrupted, notes)


def measure_compute(measurements: Sequence[Measurement], deadline: float, threads: int, device: str,
                    progress: Progress | None = None,
                    max_problem_bytes: int | None = None) -> tuple[list[ComputeSample], bool]:
    """Time measurements in order until the deadline; returns the samples and whether Ctrl-C stopped it.

    Problems whose tensors would not fit in ``max_problem_bytes`` (default: a
    quarter of the device's memory), or whose one run would not fit in the
    time left (judged from the fastest FLOP rate seen so far), are left to the
    fitted model rather than risking the machine or the budget.
    """
    from calibrate.kernels import TIMED_KINDS, build_kernel, time_kernel

    torch.set_num_threads(threads)
    target = torch.device(device)
    memory_cap = max_problem_bytes or _device_spec(device).memory_bytes // 4
    samples: list[ComputeSample] = []
    timed = [m for m in measurements if m.problem.kind in TIMED_KINDS]
    best_flops_per_s = ROUGH_FLOPS_PER_S
    try:
        for index, item in enumerate(timed):
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                break
            guess_s = item.flops / best_flops_per_s + _footprint_bytes(item) / ROUGH_BYTES_PER_S
            if _footprint_bytes(item) > memory_cap or 4 * guess_s > remaining_s:
                continue  # set-up, warm-up and one run must fit in what is left
            per_kernel_s = min(MAX_RUN_TIME_S, max(MIN_RUN_TIME_S, remaining_s / (len(timed) - index) / 3))
            try:
                kernel = build_kernel(item.problem, item.phase, target)
            except ValueError:  # a form with no kernel here (an activation it does not know): the pooled fit
                continue
            timing = time_kernel(kernel, per_kernel_s, threads)
            samples.append(ComputeSample(item.problem.kind, item.phase, item.problem.key, item.flops, item.bytes,
                                         timing.median_s, timing.iqr_s, timing.repeats))
            best_flops_per_s = max(best_flops_per_s, item.flops / timing.median_s)
            if progress is not None:
                progress("compute", index + 1, len(timed))
    except KeyboardInterrupt:
        return samples, True
    return samples, False


def _footprint_bytes(item: Measurement) -> int:
    """Memory one timing needs: inputs, output, weight, and their gradients (twice the tensors)."""
    problem = item.problem
    elements = sum(prod(shape) for shape in problem.input_shapes) + prod(problem.output_shape)
    elements += prod(problem.weight_shape) if problem.weight_shape else 0
    return 2 * elements * problem.itemsize


def _measure_comm(request: CalibrationRequest, deadline: float) -> tuple[list[CommSample], list[str], bool]:
    from calibrate.comm_ranks import run_comm_measurement

    budget_s = deadline - time.monotonic()
    sizes = request.comm_sizes_bytes or COMM_SIZES_BYTES
    try:
        measured = run_comm_measurement(request.ranks, sizes, budget_s, backend=request.backend, repeats=COMM_REPEATS)
    except KeyboardInterrupt:
        return [], ["interrupted while timing collectives: none kept"], True
    except InputError as err:  # nothing could be timed in what was left: keep the compute results
        return [], [f"collectives not timed: {err}"], False
    notes = [f"{name} not timed: {why}" for name, why in measured.skipped.items()]
    if measured.unfinished:
        notes.append(f"{measured.unfinished} collective measurements did not fit in the budget")
    return list(measured.samples), notes, False


def _build_profile(request: CalibrationRequest, compute: list[ComputeSample], comm: list[CommSample],
                   seconds: float, interrupted: bool, total: int, notes: list[str]) -> Profile:
    from calibrate.comm_fit import fit_comm

    compute_fits, compute_error = fit_compute(compute) if compute else ([], FitError(None, None, 0))
    comm_fits, comm_error = fit_comm(comm) if comm else ([], FitError(None, None, 0))
    meta = _metadata(request, seconds) | {
        "problems_total": total, "problems_measured": len(compute), "left_to_fit": total - len(compute),
        "interrupted": interrupted, "notes": notes,
    }
    return Profile(device=_device_spec(request.device), meta=meta, compute_samples=tuple(compute),
                   compute_fits=tuple(compute_fits), comm_samples=tuple(comm), comm_fits=tuple(comm_fits),
                   compute_error=compute_error, comm_error=comm_error)


def _metadata(request: CalibrationRequest, seconds: float) -> dict[str, Any]:
    return {
        "source": "measured",
        "host": socket.gethostname(),
        "device_name": _device_spec(request.device).name,
        "torch_version": torch.__version__,
        "backend": request.backend,
        "dtype": request.graph.graph["dtype"],
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
    return DeviceSpec(f"CPU {_cpu_name()} ({os.cpu_count()} cores)", int(memory))


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
