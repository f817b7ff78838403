"""The host's other ranks, busy while calibration times kernels: helper processes running the same chunks.

In a run, the R ranks on one CPU host compute at once and share its caches
and memory bandwidth (and, with more threads than cores, the cores).
:class:`Busy` starts ``helpers`` processes (spawn context, ``threads`` each)
that run the chunk the timing process is timing, pass after pass, until told
to move on; :meth:`Busy.run` switches them to a chunk and returns once all of
them have built its kernels and started.

Assumptions: the helpers run the same local problems as the timed rank (a
run's ranks do, a layer at a time); their loads are not timed; a helper that
dies or stalls for ``START_TIMEOUT_S`` only stops the helping — the timing
goes on, and the notes say so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
import torch.multiprocessing as mp

from processes.heap import steady_heap

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess
    from multiprocessing.sharedctypes import Synchronized, SynchronizedArray

    from calibrate.sequences import Chunk

__all__ = ["Busy"]

START_TIMEOUT_S = 60.0
_STOP = -1


class Busy:
    """``with Busy(chunks, helpers=…, threads=…, device=…) as busy: busy.run(i)`` before timing chunk ``i``."""

    def __init__(self, chunks: Sequence[Chunk], *, helpers: int, threads: int, device: str) -> None:
        self.chunks = list(chunks)
        self.helpers = helpers
        self.threads = threads
        self.device = device
        self.failed: str | None = None
        self._context = mp.get_context("spawn")
        self._target: Synchronized[int] = self._context.Value("i", _STOP - 1)
        self._running: SynchronizedArray[int] = self._context.Array("i", [_STOP - 1] * max(helpers, 1))
        self._processes: list[BaseProcess] = []

    def __enter__(self) -> Busy:
        for index in range(self.helpers):
            process = self._context.Process(target=_help, daemon=True,
                                            args=(index, self.chunks, self.threads, self.device, self._target,
                                                  self._running))
            process.start()
            self._processes.append(process)
        return self

    def __exit__(self, *exc: object) -> None:
        self._target.value = _STOP
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()

    def run(self, index: int) -> None:
        """Switch the helpers to chunk ``index``; wait until each runs it (or give up on helping)."""
        if not self._processes or self.failed:
            return
        self._target.value = index
        deadline = time.monotonic() + START_TIMEOUT_S
        while any(self._running[h] != index for h in range(self.helpers)):
            dead = [p.exitcode for p in self._processes if not p.is_alive()]
            if dead or time.monotonic() > deadline:
                self.failed = (f"a helper process exited ({dead[0]})" if dead
                               else f"helpers did not start chunk {index} within {START_TIMEOUT_S:.0f} s")
                self._target.value = _STOP
                return
            time.sleep(0.001)


def _help(index: int, chunks: Sequence[Chunk], threads: int, device: str, target: Synchronized[int],
          running: SynchronizedArray[int]) -> None:
    from calibrate.sequences import build_chunk

    torch.set_num_threads(threads)
    steady_heap()
    current: int | None = None
    kernels: list[Callable[[], object]] = []
    while True:
        wanted = target.value
        if wanted == _STOP:
            return
        if wanted != current and 0 <= wanted < len(chunks):
            kernels = []
            kernels = [k for k in build_chunk(chunks[wanted], torch.device(device)) if k is not None]
            current = wanted
            running[index] = wanted
        if not kernels:
            time.sleep(0.001)
            continue
        for kernel in kernels:
            kernel()
            if target.value != current:
                break
