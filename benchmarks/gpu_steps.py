"""The guarded steps of ``benchmarks/gpu_check.py``: the run's clock, the report rewritten after every step, and
commands run in their own process group within the time left (a failure or timeout recorded, the check goes on)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESERVE_S = 10.0  # kept back for the last report
MIN_STEP_S = 15.0  # a step with less time than this left is skipped
STDERR_TAIL = 2000  # characters of a failed step's stderr kept in the report

__all__ = ["Clock", "MIN_STEP_S", "Report", "communicate", "guarded", "parsed", "run_step", "shown"]


@dataclass
class Report:
    """The document being built: the machine, each step with its command, and the figures."""

    settings: Any  # gpu_check.Settings: where it writes (``out``)
    started: float
    document: dict[str, Any] = field(default_factory=dict)

    def record(self, entry: dict[str, Any]) -> None:
        self.document.setdefault("steps", []).append(entry)
        self.write()

    def result(self, *keys: str) -> dict[str, Any]:
        """The results block at ``keys`` (made on first use)."""
        block = self.document.setdefault("results", {})
        for key in keys:
            block = block.setdefault(key, {})
        return block

    def write(self) -> None:
        from cost_models.formats.jsonio import write_json_atomic

        self.document["seconds"] = round(time.monotonic() - self.started, 1)
        write_json_atomic(self.settings.out, self.document)


@dataclass(frozen=True)
class Clock:
    """The whole run's deadline."""

    deadline: float

    def left_s(self) -> float:
        return self.deadline - time.monotonic() - RESERVE_S


def shown(command: list[str]) -> str:
    """A command as a person would type it from the repository root."""
    return shlex.join(["python3" if part == sys.executable else part for part in command])


def run_step(report: Report, clock: Clock, name: str, command: list[str], limit_s: float,
             parse: bool = True) -> Any | None:
    """Run ``command`` guarded (own process group, timeout within the budget); returns its stdout JSON or None."""
    allowed_s = min(limit_s, clock.left_s())
    entry: dict[str, Any] = {"step": name, "command": shown(command)}
    if allowed_s < MIN_STEP_S:
        report.record({**entry, "skipped": f"budget: {max(allowed_s, 0.0):.0f} s left"})
        return None
    started = time.monotonic()
    code, out, err = communicate(command, allowed_s)
    entry.update(rc=code, seconds=round(time.monotonic() - started, 1))
    document = parsed(out) if parse else out
    if code != 0:
        entry["error"] = f"timed out after {allowed_s:.0f} s" if code is None else _tail(err)
    report.record(entry)
    return document if code in (0, 1) or not parse else None


def communicate(command: list[str], timeout_s: float) -> tuple[int | None, str, str]:
    """``command`` run from the repository root (``PYTHONPATH`` it): exit code (None on timeout), stdout and stderr;
    the whole process group is stopped on timeout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout_s)
        return process.returncode, out, err
    except subprocess.TimeoutExpired:
        _stop_group(process)
        out, err = process.communicate()
        return None, out, err


def _stop_group(process: subprocess.Popen[str]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=wait_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def parsed(text: str) -> Any | None:
    """``text`` as JSON, or None."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines)[-STDERR_TAIL:] if lines else "(no output on stderr)"


def guarded(report: Report, name: str, action: Callable[[], Any]) -> Any | None:
    """Run an in-process step; an exception is recorded and ``None`` returned."""
    started = time.monotonic()
    try:
        value = action()
    except Exception as err:  # noqa: BLE001 - every failure is recorded, and the check goes on
        report.record({"step": name, "error": f"{type(err).__name__}: {err}",
                       "seconds": round(time.monotonic() - started, 1)})
        return None
    report.record({"step": name, "seconds": round(time.monotonic() - started, 1)})
    return value
