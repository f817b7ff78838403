"""The model-coverage suite's hard cap: a supervisor process that kills a worker stuck on one model.

Each model's checks have their own timers (``parplan.cli.check``: a SIGALRM
deadline in this process, the rank pool's timeout for the ranks), but a timer
cannot interrupt a long call into C (a forward pass of a huge model while
tracing, a kernel under memory pressure). So the suite runs its models in a
worker process; before each model, and after each of its checks, the worker
writes a heartbeat (JSON: the model, when it started, the checks finished).
The supervisor polls it: when one model has run ``limit_s`` (the cap plus a
grace), it kills the worker's whole process group (the worker, its fork
server, its ranks), reports the heartbeat to ``on_stuck`` (which records the
model as failed) and starts a fresh worker, which resumes with the next model.
A worker that dies (the kernel's OOM killer) is handled the same way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["GRACE_S", "beat", "supervise"]

GRACE_S = 60.0
"""How long past its cap a model may run before its worker is killed (its own timers get the first chance)."""

_POLL_S = 1.0


def beat(path: Path, heartbeat: dict[str, Any]) -> None:
    """Write ``heartbeat`` (must hold ``started``, a ``time.time()``) to ``path`` atomically."""
    scratch = path.with_name(path.name + ".tmp")
    scratch.write_text(json.dumps(heartbeat))
    os.replace(scratch, path)


def supervise(worker: Sequence[str], *, heartbeat: Path, limit_s: float,
              on_stuck: Callable[[dict[str, Any], str], None]) -> int:
    """Run ``worker`` (argv) until it exits by itself; restart it after each model it was killed or died on.

    ``on_stuck(heartbeat, why)`` records the model the worker was on. Returns the last worker's exit code;
    a worker that fails before its first heartbeat is not restarted (it would fail again).
    """
    while True:
        heartbeat.unlink(missing_ok=True)
        process = subprocess.Popen(list(worker), start_new_session=True)
        try:
            stuck = _watch(process, heartbeat, limit_s)
        finally:
            _kill(process)
        if stuck is None:
            return process.returncode
        on_stuck(*stuck)


def _watch(process: subprocess.Popen[bytes], heartbeat: Path, limit_s: float) -> tuple[dict[str, Any], str] | None:
    """Wait for ``process``; the heartbeat and why, when it is killed at the limit or dies on a model."""
    while process.poll() is None:
        time.sleep(_POLL_S)
        last = _read(heartbeat)
        if last is not None and time.time() - last["started"] > limit_s:
            _kill(process)
            return last, f"killed by the suite's hard cap after {limit_s:.0f} s on this model"
    last = _read(heartbeat)
    if process.returncode != 0 and last is not None:
        return last, f"the suite's worker {_death(process.returncode)} on this model"
    return None


def _death(code: int) -> str:
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"died ({signal.Signals(-code).name})"
    except ValueError:
        return f"died (signal {-code})"


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``process``'s whole group (it leads a session of its own), then reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
