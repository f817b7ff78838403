"""A steady host heap: memory a step frees is kept for the next step instead of handed back to the OS.

A training step on CPU allocates and frees the same activation-sized blocks
every step. glibc's malloc serves blocks above its mmap threshold (128 KiB at
start, moved up as blocks are freed) with fresh ``mmap`` and returns free
memory at the heap's top to the OS above 128 KiB: each step's blocks then come
back as new pages, zeroed and faulted in one 4 KiB page at a time, and how
many do depends on the heap's history — timings of the same kernel swing
with it. On the 2-core development VM (2026-12-04): resnet18 8×3×64×64 on two
ranks (``n2``) took 203–246 ms a step with glibc's defaults and 166–176 ms with
this setting (three interleaved pairs); PyTorch's fused batch-norm on
8×64×56×56 took 6.0–15.8 ms from run to run and a steady 6.0–6.2 ms with it.

The setting: serve blocks up to 1 GiB from the heap (32 MiB on glibc versions
that refuse more) and trim the heap only when 1 GiB of it is free — what
PyTorch's CUDA caching allocator does for device memory. Every process that
times or runs steps takes it (ranks, calibration, the benchmarks' peers
alike), so what calibration times is what a run gets. The process's resident
size stays near its peak; the tensor memory the cost model predicts is not
changed by it.

Left alone when the user chose the allocator: ``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_`` or ``glibc.malloc`` tunables set, or another
allocator preloaded (jemalloc, tcmalloc, mimalloc); and on hosts without glibc.
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["hand_back_free", "steady_heap"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_HEAP_BLOCK_BYTES = (1 << 30, 32 << 20)  # the largest first; older glibc accept up to 32 MiB
_TRIM_BYTES = 1 << 30
_USER_CHOICES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
_applied: bool | None = None


def steady_heap() -> bool:
    """Keep freed host memory in this process's heap (module docstring); whether the setting is in force.

    Idempotent; a no-op (``False``) where the user chose the allocator or the host has no glibc.
    """
    global _applied
    if _applied is None:
        _applied = _user_chose_allocator() is None and _set_glibc_thresholds()
    return _applied


def _user_chose_allocator() -> str | None:
    """What in the environment says the user chose the allocator, or ``None``."""
    for name in _USER_CHOICES:
        if name in os.environ:
            return name
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    preload = os.environ.get("LD_PRELOAD", "")
    return next((name for name in _OTHER_ALLOCATORS if name in preload), None)


def _set_glibc_thresholds() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    if not any(libc.mallopt(_M_MMAP_THRESHOLD, size) == 1 for size in _HEAP_BLOCK_BYTES):
        return False
    return libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_BYTES) == 1


def hand_back_free() -> bool:
    """Hand the heap's free pages back to the OS now (glibc's ``malloc_trim``); whether any were.

    For a one-off drop that a steady heap would otherwise keep for the life of the process: the parts of a
    whole model that a pipeline stage or a ``--verify`` reference empties after building it. A no-op
    (``False``) on hosts without glibc.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim(0) == 1
    except (OSError, AttributeError):
        return False
