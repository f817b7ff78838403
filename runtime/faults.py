"""Failures injected on purpose, to test and measure recovery: ``PARPLAN_FAULT=KIND:RANK:STEP``.

At the start of step ``STEP`` (1-based, warm-up steps included; ``STEP − 1``
updates are done) rank ``RANK`` of ``parplan run``

* ``kill``: sends itself SIGKILL (a crashed process, no clean-up);
* ``hang``: sleeps without end (a deadlocked or stalled process);
* ``exit``: exits with code 3 (a process that quits).

Only the first attempt is hit: a group that torchrun's agent restarted
(``--max-restarts``, ``TORCHELASTIC_RESTART_COUNT`` > 0) runs clean, so a
test can kill a rank once and watch the run recover. Before it strikes, the
rank prints ``parplan: fault: …`` with the wall-clock time to stderr, from
which ``benchmarks/failures.py`` measures how long the others take to exit.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

from cost_models.errors import InputError

__all__ = ["ENVIRONMENT", "Fault", "planned", "strike"]

ENVIRONMENT = "PARPLAN_FAULT"
_KINDS = ("kill", "hang", "exit")


@dataclass(frozen=True)
class Fault:
    """Rank ``rank`` fails as ``kind`` at the start of step ``step`` (1-based)."""

    kind: str
    rank: int
    step: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.rank}:{self.step}"


def planned(text: str | None = None) -> Fault | None:
    """The fault ``PARPLAN_FAULT`` (or ``text``) asks for, ``None`` when unset.

    Raises:
        InputError: The value is not ``KIND:RANK:STEP`` with a known kind, a rank ≥ 0 and a step ≥ 1.
    """
    text = os.environ.get(ENVIRONMENT, "") if text is None else text
    if not text.strip():
        return None
    parts = text.strip().split(":")
    try:
        kind, rank, step = parts[0], int(parts[1]), int(parts[2])
    except (IndexError, ValueError):
        kind, rank, step = "", -1, 0
    if len(parts) != 3 or kind not in _KINDS or rank < 0 or step < 1:
        raise InputError(f"{ENVIRONMENT}={text!r} is not KIND:RANK:STEP with KIND one of {', '.join(_KINDS)}, "
                         "RANK ≥ 0 and STEP ≥ 1 (e.g. kill:1:3); unset it to run without a fault")
    return Fault(kind, rank, step)


def strike(fault: Fault | None, rank: int, step: int) -> None:
    """Fail now if ``fault`` is for this rank and step (first attempt only); otherwise return."""
    if fault is None or fault.rank != rank or fault.step != step:
        return
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return
    print(f"parplan: fault: rank {rank} {fault.kind}s at step {step} (t={time.time():.3f})", file=sys.stderr,
          flush=True)
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == "hang":
        while True:
            time.sleep(3600)
    os._exit(3)
