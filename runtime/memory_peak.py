"""A rank's peak tensor memory over one training step, measured apart from the cost model's own accounting.

* CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``
  — the caching allocator's count of bytes in live tensors (not what it
  reserves).
* CPU: the bytes of every tensor storage alive when the step starts, found by
  the garbage collector (parameters, gradient buckets, optimizer state, the
  batch — whatever holds them, counted once per storage), plus the highest
  running total, over the step, of the allocations made during it and not yet
  freed, as ``torch.profiler``'s memory events (``profile_memory=True``)
  report every allocation of the CPU allocator: halo buffers, temporaries,
  tensors saved for backward and gradients included. Not the process's
  resident size, which counts the interpreter, libraries and freed pages.

Tensors allocated before the step and freed inside it (none in parplan's
steps once gradients are set to ``None`` beforehand) would be counted as if
still alive: the figure is then an upper bound.
"""

from __future__ import annotations

import gc
import warnings
from typing import Callable

import torch

__all__ = ["peak_tensor_bytes"]

_MEMORY_EVENT = "[memory]"


def peak_tensor_bytes(step: Callable[[], None], device: torch.device) -> int:
    """Run ``step`` once and return the peak bytes of live tensors on ``device`` during it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    before = live_storage_bytes(device)
    return before + _peak_allocated_during(step)


def live_storage_bytes(device: torch.device) -> int:
    """Bytes of the distinct storages of every tensor on ``device`` the garbage collector can reach."""
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


def _peak_allocated_during(step: Callable[[], None]) -> int:
    """The highest running total of the bytes allocated (less those freed) while ``step`` runs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        step()
    events = sorted((event.start_ns(), event.nbytes()) for event in profiler.profiler.kineto_results.events()
                    if event.name() == _MEMORY_EVENT and event.device_type() == torch.autograd.DeviceType.CPU)
    total = peak = 0
    for _, change in events:
        total += change
        peak = max(peak, total)
    return peak
