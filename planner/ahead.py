"""Results computed ahead in a forked helper process while the planner goes on (issue 23: both cores).

A search of many stage sizes prices thousands of layer costs that do not depend on each other. :func:`ahead`
forks a helper — a copy of the planner's process, the same inputs and code — that runs ``produce(send)``: it
computes values in an order of its own and sends each ``(key, value)`` as it is done. The planner takes what
has arrived (:meth:`Ahead.arrived`) before it computes such a value itself, and never waits for one: a value
the helper has not sent yet, it computes on its own. Values must be pure functions of their keys, so a
search gives the same result with or without a helper, at whatever speed the helper runs.

There is no helper (``None``) where ``fork`` is unavailable, the process may use one core only, or it is
itself a daemonic or multiprocessing child (a what-if worker: its siblings use the other cores). The helper
runs ``SCHED_IDLE`` where available — on cycles no other process wants, so it slows nothing on a busy
machine — else at the lowest priority; a failure in it only means the planner computes everything itself.
:meth:`Ahead.close` ends it (it may still be computing values nobody will ask for).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import warnings
from multiprocessing.connection import Connection
from typing import Any, Callable, Hashable

try:
    import fcntl
except ImportError:  # not a POSIX system: pipes keep their default size
    fcntl = None  # type: ignore[assignment]

__all__ = ["Ahead", "Produce", "ahead"]

Send = Callable[[Hashable, Any], None]
Produce = Callable[[Send], None]
"""``produce(send)``: compute values and ``send(key, value)`` each (in the helper process)."""

_NICENESS = 19  # added to the helper's priority where it cannot be SCHED_IDLE
_PIPE_BYTES = 1 << 20  # Linux's default pipe-max-size


class Ahead:
    """The planner's end of one helper process (module docstring)."""

    def __init__(self, process: Any, connection: Connection) -> None:
        self.process, self.connection = process, connection
        self.open = True

    def arrived(self) -> list[tuple[Hashable, Any]]:
        """The ``(key, value)`` pairs sent since the last call, without waiting for more."""
        found = []
        try:
            while self.open and self.connection.poll():
                found.append(self.connection.recv())
        except (EOFError, OSError):  # the helper ended (all sent, or it failed)
            self.open = False
        return found

    def close(self) -> None:
        """End the helper (if still running), reap it and close the pipe."""
        self.open = False
        if self.process.is_alive():
            self.process.terminate()
        self.process.join()
        self.connection.close()


def ahead(produce: Produce) -> Ahead | None:
    """Start ``produce`` in a forked helper; ``None`` where there can be none (module docstring)."""
    if not _may_fork():
        return None
    context = multiprocessing.get_context("fork")
    receiving, sending = context.Pipe(duplex=False)
    _widen(sending)
    process = context.Process(target=_helper, args=(produce, sending), daemon=True)
    for stream in (sys.stdout, sys.stderr):  # else the helper would write the planner's buffered output again
        stream.flush()
    try:
        with warnings.catch_warnings():  # (Python ≥ 3.12 warns of forking with threads; the helper uses none)
            warnings.simplefilter("ignore", DeprecationWarning)
            process.start()
    except OSError:  # no process left to fork
        receiving.close()
        sending.close()
        return None
    sending.close()  # the helper holds its own end: the planner sees EOF once it ends
    return Ahead(process, receiving)


def _widen(connection: Connection) -> None:
    """Let the pipe hold :data:`_PIPE_BYTES` (Linux; 64 KiB by default): the planner takes values only when it
    needs one, and the helper must not stall on a full pipe meanwhile."""
    try:
        fcntl.fcntl(connection.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)  # type: ignore[union-attr, attr-defined]
    except (AttributeError, OSError):  # not Linux, or above this system's pipe-max-size: the default
        pass


def _may_fork() -> bool:
    if "fork" not in multiprocessing.get_all_start_methods() or multiprocessing.parent_process() is not None:
        return False
    if multiprocessing.current_process().daemon:
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores >= 2


def _helper(produce: Produce, connection: Connection) -> None:
    """The helper's life: lowest priority, ``produce``, then close its end (whatever happened)."""
    _lowest_priority()
    try:
        produce(lambda key, value: connection.send((key, value)))
    except (Exception, KeyboardInterrupt):  # noqa: BLE001 — the planner computes whatever did not arrive
        pass
    finally:
        connection.close()


def _lowest_priority() -> None:
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        try:
            os.nice(_NICENESS)
        except OSError:
            pass
