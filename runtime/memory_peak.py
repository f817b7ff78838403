"""A rank's peak tensor memory over one training step, measured apart from the cost model's own accounting.

* CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``
  — the caching allocator's count of bytes in live tensors (not what it
  reserves).
* CPU: the bytes of the storages the run holds when the step starts — its
  parameters, buffers and gradients, the optimizer's state and the gradient
  buckets, each storage once (:func:`held_tensors`) — plus the highest
  running total, over the step, of the allocations made during it and not yet
  freed, as ``torch.profiler``'s memory events (``profile_memory=True``)
  report every allocation of the CPU allocator: the batch, halo buffers,
  temporaries, tensors saved for backward and gradients included. Not the
  process's resident size, which counts the interpreter, libraries and freed
  pages; nor other runs' tensors a reused rank process may still hold.

Tensors allocated before the step and freed inside it (none in parplan's
steps once gradients are set to ``None`` beforehand) would be counted as if
still alive: the figure is then an upper bound.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable, Iterable

import torch

from processes.quiet import native_stderr_silenced

__all__ = ["held_tensors", "live_storage_bytes", "peak_tensor_bytes", "storage_bytes"]

_MEMORY_EVENT = "[memory]"


def peak_tensor_bytes(step: Callable[[], object], device: torch.device, held: Iterable[torch.Tensor] = ()) -> int:
    """Run ``step`` once and return the peak bytes of live tensors on ``device`` during it; ``held``: the tensors
    the run holds when it starts (CPU; CUDA's allocator counts them itself)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    return storage_bytes(held, device) + _peak_allocated_during(step)


def held_tensors(module: torch.nn.Module, optimizer: torch.optim.Optimizer, *more: torch.Tensor) -> list[torch.Tensor]:
    """What a run holds between steps: ``module``'s parameters, their gradients and its buffers, the
    optimizer's state, and ``more`` (gradient buckets)."""
    found = [*module.parameters(), *module.buffers(), *more]
    found += [p.grad for p in module.parameters() if p.grad is not None]
    found += [value for state in optimizer.state.values() for value in state.values()
              if isinstance(value, torch.Tensor)]
    return found


def storage_bytes(tensors: Iterable[torch.Tensor], device: torch.device) -> int:
    """Bytes of the distinct storages of ``tensors`` on ``device``."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        _count(tensor, device, seen)
    return sum(size for pointer, size in seen.items() if pointer)


def live_storage_bytes(device: torch.device) -> int:
    """Bytes of the distinct storages of every tensor on ``device`` the garbage collector can reach (what the
    process holds, other runs' tensors included)."""
    gc.collect()
    seen: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance on deprecated module attributes warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            _count(obj, device, seen)
    return sum(size for pointer, size in seen.items() if pointer)


def _count(obj: object, device: torch.device, seen: dict[int, int]) -> None:
    try:
        if not isinstance(obj, torch.Tensor) or obj.device != device or obj.is_meta:
            return
        storage = obj.untyped_storage()
        seen.setdefault(storage.data_ptr(), storage.nbytes())
    except (RuntimeError, NotImplementedError):  # tensors without a storage (sparse, functional wrappers)
        return


def _peak_allocated_during(step: Callable[[], object]) -> int:
    """The highest running total of the bytes allocated (less those freed) while ``step`` runs."""
    from torch.profiler import ProfilerActivity, profile

    with native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        step()
    events = sorted((event.start_ns(), event.nbytes()) for event in profiler.profiler.kineto_results.events()
                    if event.name() == _MEMORY_EVENT and event.device_type() == torch.autograd.DeviceType.CPU)
    total = peak = 0
    for _, change in events:
        total += change
        peak = max(peak, total)
    return peak
