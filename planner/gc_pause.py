"""The cyclic garbage collector paused while a search runs.

A search allocates millions of small tuples, layouts and cost records and keeps most of them (its caches), with
hardly any reference cycles to free: every automatic collection of the oldest generation walks the whole heap —
the traced graph, torch's modules, the caches — and finds next to nothing (ResNet-50 on 1024 devices: some 0.9 s
of a 4.9 s search). Reference counting still frees everything acyclic at once; cycles made meanwhile wait for
the next collection after the search.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable automatic garbage collection inside the block; re-enabled after it if it was enabled before
    (nested blocks and a caller's own ``gc.disable()`` are left as they were)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
