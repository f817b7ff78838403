"""Failures injected on purpose, to test and measure recovery: ``PARPLAN_FAULT=KIND:RANK:STEP[,KIND:RANK:STEP…]``.

At the start of step ``STEP`` (1-based, warm-up steps included; ``STEP − 1``
updates are done) rank ``RANK`` of ``parplan run``

* ``kill``: sends itself SIGKILL (a crashed process, no clean-up);
* ``hang``: sleeps without end (a deadlocked or stalled process);
* ``exit``: exits with code 3 (a process that quits);
* ``full``: (not at a step's start) fails to write its shard of the checkpoint
  after ``STEP`` updates with ``ENOSPC``, as a full disk does
  (``runtime.checkpoint``).

A list is a schedule across attempts: its ``i``-th fault hits attempt ``i``
(the first run is attempt 0; a group torchrun's agent restarted,
``--max-restarts``, has ``TORCHELASTIC_RESTART_COUNT`` = ``i``), and an attempt
past the list runs clean — so ``kill:1:7,kill:0:19`` kills rank 1 at step 7,
and rank 0 at step 19 of the run that resumed. Before it strikes, the rank
prints ``parplan: fault: …`` with the wall-clock time to stderr, from which
``benchmarks/failures.py`` and ``benchmarks/soak.py`` measure what it cost.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cost_models.errors import InputError
from processes.job import job_attempt

__all__ = ["ENVIRONMENT", "Fault", "FaultKind", "Schedule", "attempt", "disk_full", "planned", "strike"]

ENVIRONMENT = "PARPLAN_FAULT"
FaultKind = Literal["kill", "hang", "exit", "full"]
"""How a rank fails (module docstring)."""
_KINDS: tuple[FaultKind, ...] = ("kill", "hang", "exit", "full")


@dataclass(frozen=True)
class Fault:
    """Rank ``rank`` fails as ``kind`` at the start of step ``step`` (1-based)."""

    kind: FaultKind
    rank: int
    step: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.rank}:{self.step}"


@dataclass(frozen=True)
class Schedule:
    """One fault per attempt, in order (module docstring)."""

    faults: tuple[Fault, ...]

    def now(self) -> Fault | None:
        """The fault of this attempt (``processes.job.job_attempt``), ``None`` past the list."""
        index = attempt()
        return self.faults[index] if index < len(self.faults) else None

    def __str__(self) -> str:
        return ",".join(map(str, self.faults))


def attempt() -> int:
    """Which attempt this is: 0 for the first run, the job's restarts after that (``processes.job``)."""
    return job_attempt()


def planned(text: str | None = None) -> Schedule | None:
    """The faults ``PARPLAN_FAULT`` (or ``text``) asks for, ``None`` when unset.

    Raises:
        InputError: An item is not ``KIND:RANK:STEP`` with a known kind, a rank ≥ 0 and a step ≥ 1.
    """
    text = os.environ.get(ENVIRONMENT, "") if text is None else text
    if not text.strip():
        return None
    return Schedule(tuple(_fault(item, text) for item in text.strip().split(",")))


def _fault(item: str, text: str) -> Fault:
    parts = item.strip().split(":")
    try:
        name, rank, step = parts[0], int(parts[1]), int(parts[2])
    except (IndexError, ValueError):
        name, rank, step = "", -1, 0
    kind = next((known for known in _KINDS if known == name), None)
    if len(parts) != 3 or kind is None or rank < 0 or step < 1:
        raise InputError(f"{ENVIRONMENT}={text!r}: {item.strip()!r} is not KIND:RANK:STEP with KIND one of "
                         f"{', '.join(_KINDS)}, RANK ≥ 0 and STEP ≥ 1 (e.g. kill:1:3, or kill:1:7,kill:0:19 for one "
                         "fault per attempt); unset it to run without a fault")
    return Fault(kind, rank, step)


def strike(faults: Schedule | None, rank: int, step: int) -> None:
    """Fail now if this attempt's fault is for this rank and the start of this step; otherwise return."""
    fault = faults.now() if faults is not None else None
    if fault is None or fault.kind == "full" or fault.rank != rank or fault.step != step:
        return
    _announce(fault)
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == "hang":
        while True:
            time.sleep(3600)
    os._exit(3)


def disk_full(rank: int, step: int, path: Path) -> None:
    """Raise ``ENOSPC`` for ``path`` if this attempt's fault is ``full`` for this rank and the checkpoint after
    ``step`` updates."""
    faults = planned()
    fault = faults.now() if faults is not None else None
    if fault is not None and fault.kind == "full" and (fault.rank, fault.step) == (rank, step):
        _announce(fault)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def _announce(fault: Fault) -> None:
    what = {"kill": "kills", "hang": "hangs", "exit": "exits", "full": "finds the disk full"}[fault.kind]
    print(f"parplan: fault: rank {fault.rank} {what} at step {fault.step} (t={time.time():.3f})", file=sys.stderr,
          flush=True)
