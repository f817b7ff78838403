"""What a rank of ``parplan run`` measures and reports, plain or pipelined: its device, the peak memory over
ranks, and rank 0's measurement document (``parplan.measurement/1``).
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from runtime.options import RunOptions
from runtime.waiting import all_reduce

if TYPE_CHECKING:
    from cost_models.formats.plan import Plan

__all__ = ["device_of_rank", "largest_over_ranks", "measurement_document", "memory_method", "peak_memory_bytes",
           "peak_report", "synchronise", "verify_only"]


def device_of_rank() -> torch.device:
    """This rank's device: its GPU under NCCL (``LOCAL_RANK``), else the CPU."""
    if dist.get_backend() == "nccl":
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank() % max(1, torch.cuda.device_count())))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def synchronise(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a step's time is taken after it)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def largest_over_ranks(value: int, device: torch.device) -> int:
    """``value``'s maximum over every rank."""
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    all_reduce(tensor, "the peak-memory allreduce", dist.ReduceOp.MAX)
    return int(tensor.item())


def peak_memory_bytes(device: torch.device) -> int:
    """Largest over ranks: CUDA's peak allocation, or the process's peak resident size on CPU."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return largest_over_ranks(peak, device)


def verify_only(options: RunOptions, plan: Plan, verified: dict[str, object] | None,
                device: torch.device) -> dict[str, object] | None:
    """Rank 0's document of a run with no steps (``parplan check``'s verifies): the split is not built again."""
    memory = peak_memory_bytes(device)
    return measurement_document(options, plan, [], [], memory, verified) if dist.get_rank() == 0 else None


def measurement_document(options: RunOptions, plan: Plan, per_step: list[float], losses: list[float], memory: int,
                         verified: dict[str, object] | None, peak: int | None = None) -> dict[str, object]:
    """Rank 0's measurement of a run (also the pipeline worker's): per-step seconds, losses, memory, verify.

    ``memory``: the largest rank's peak resident size (CPU) or allocation (CUDA); ``peak``: its peak bytes of live
    tensors over one step (``runtime.memory_peak``), reported beside the plan's predicted peak.
    """
    return {
        "format": "parplan.measurement/1",
        "model": {"spec": options.model, "input_shape": list(options.input_shape), "dtype": options.dtype,
                  "fingerprint": plan.fingerprint,
                  **({"input_shapes": [list(s) for s in options.shapes]} if len(options.shapes) > 1 else {})},
        "plan": {"summary": plan.summary(), "devices": plan.cluster.devices},
        "nproc": dist.get_world_size(), "backend": dist.get_backend(), "launcher": options.launcher,
        "steps": options.steps, "warmup": options.warmup,
        "iteration_s": statistics.median(per_step) if per_step else None,
        "per_step_s": per_step, "loss": losses,
        "predicted_iteration_s": plan.predicted.iteration_s if plan.predicted else None,
        "memory_bytes_max": memory,
        **({"memory": peak_report(peak, plan, memory_method())} if peak is not None else {}),
        "verify": verified,
        "machine": {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
                    "torch": torch.__version__, "threads_per_rank": torch.get_num_threads(),
                    "device": torch.cuda.get_device_name() if torch.cuda.is_available() and dist.get_backend() == "nccl"
                    else "cpu"},
    }


def peak_report(peak: int, plan: Plan, method: str) -> dict[str, object]:
    """The measured peak of live tensors beside the plan's predicted peak and their relative difference."""
    predicted = plan.predicted.memory_bytes_max if plan.predicted else None
    return {"peak_bytes": peak, "predicted_bytes": predicted, "method": method,
            "rel_err": (predicted - peak) / peak if predicted is not None and peak else None}


def memory_method() -> str:
    """How :func:`runtime.memory_peak.peak_tensor_bytes` measured on this run's device."""
    return "torch.cuda.max_memory_allocated" if dist.get_backend() == "nccl" else "held tensors + torch.profiler"
