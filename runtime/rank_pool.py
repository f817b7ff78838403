"""A persistent pool of local gloo ranks that runs one ``runtime.train.worker`` task after another.

``parplan check`` and the model-coverage suite (``benchmarks/model_zoo.py``)
run hundreds of short ``--verify`` runs; starting ranks for each costs
seconds (every rank imports torch). A :class:`RankPool` of ``R`` ranks is
started once: the ranks are forked from a fork server that has imported
torch and the runtime (``PRELOAD``, plus what the caller adds, e.g. timm),
join one gloo group (``file://`` rendezvous in a fresh folder), then each
takes tasks from its own queue. A task is the ``RunOptions`` of one run (a
``--verify`` run: ``verify=True``, ``steps=0``, ``warmup=0``; pass the
traced ``LayerGraph`` in ``RunOptions.graph`` so the ranks skip tracing);
every rank runs ``worker(options)`` and rank 0's measurement comes back as
a :class:`TaskOutcome`.

Failures: when a rank raises, dies, or the task outlives its timeout, the
group may be desynchronised (a rank waiting in a collective its peer never
enters), so the pool is torn down — every rank killed — and the next task
starts a fresh one. The outcome names the first rank that failed and how,
in one line, with the innermost frame of parplan's code where it raised.
After ``max_tasks`` tasks the pool is also started afresh: each run's
``apply_plan`` creates process groups that live as long as the ranks.

Ranks die with this process: a thread of each rank polls this process (gone,
or a zombie after ``kill -9``, ends the rank) — the fork server does not exit
while its children run (they hold its liveness pipe), so its death cannot be
relied on; each rank also asks the kernel for SIGKILL when the fork server dies.
"""

from __future__ import annotations

import ctypes
import os
import queue as queue_module
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, NoReturn, TypedDict

from processes.forked import alive, die_with, server_preload, take_environment

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess
    from multiprocessing.queues import Queue

    from runtime.options import RunOptions

__all__ = ["LOW_MEMORY_SHARE", "MEMORY_MARGIN", "PRELOAD", "RankPool", "RankPools", "TaskOutcome", "TaskStatus",
           "available_memory_bytes", "available_memory_share", "one_line"]

TaskStatus = Literal["ok", "refused", "failed", "timeout"]
"""How a task ended (:class:`TaskOutcome`)."""

PRELOAD = ("torch", "torchvision", "torch.distributed", "torch.fx", "cost_models.ir.graph", "runtime.apply",
           "runtime.train", "runtime.pipeline.worker")
"""Imported once by the fork server, so that every rank starts with them loaded (in the order
``processes.forked.server_preload`` gives them)."""

_INPUT_ERRORS = ("InputError", "TraceError", "PlanError")
"""``cost_models.errors``' classes, recognised by name: a rank that raised one refused its input."""

MEMORY_MARGIN = 1.5
"""A pool's next task is taken to need up to this many times what its last one grew by (the next check of the
same model: another layout, another reference)."""

LOW_MEMORY_SHARE = 0.5
"""Below this share of the machine's memory available, ``RankPools`` stops idle pools before a task."""

_POLL_S = 0.2
_GRACE_S = 0.5
"""After a rank's failure report, how long to look for a rank killed by a signal (the likelier cause)."""


class _Report(NamedTuple):
    """What a rank reports of a task (``task`` 0: that it joined the group): ``payload`` is rank 0's measurement
    (``None`` on other ranks, and for task 0) or, when ``status`` is not ``ok``, one line of the failure."""

    rank: int
    task: int
    status: TaskStatus
    payload: dict[str, object] | str | None


class _PoolSettings(TypedDict):
    """What every pool of :class:`RankPools` is started with."""

    threads: int
    group_timeout_s: float
    max_tasks: int
    preload: tuple[str, ...]


@dataclass(frozen=True)
class TaskOutcome:
    """How one task ended on the pool.

    ``status``: ``"ok"`` (``document`` is rank 0's measurement), ``"refused"`` (a rank raised one of
    ``cost_models.errors``' classes: bad input found after the ranks started), ``"failed"`` (a rank raised
    anything else or died) or ``"timeout"``. ``error`` is one line naming the rank and what happened.
    """

    status: TaskStatus
    document: dict[str, Any] | None
    error: str
    seconds: float
    start_s: float = 0.0  # of ``seconds``, starting the ranks (0 when they were running)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class RankPool:
    """``ranks`` local gloo ranks that run ``worker`` tasks in turn; started at the first task, restarted after a
    failure.

    Args:
        ranks: Group size.
        threads: torch threads per rank.
        group_timeout_s: How long the ranks' default group waits for a peer (their own error after a hang).
        max_tasks: Tasks before the ranks are started afresh (process groups accumulate in them).
        preload: Modules the fork server imports besides ``PRELOAD`` (ignored once it runs: one per process).
    """

    def __init__(self, ranks: int, *, threads: int = 1, group_timeout_s: float = 300.0, max_tasks: int = 64,
                 preload: Sequence[str] = ()) -> None:
        if ranks < 1:
            raise ValueError(f"a pool needs at least one rank, not {ranks}")
        self.ranks, self.threads, self.group_timeout_s, self.max_tasks = ranks, threads, group_timeout_s, max_tasks
        self.preload = tuple(server_preload([*PRELOAD, *preload]))
        self.starts = 0
        self.last_peak_bytes = 0
        """The most its ranks held together during the last task (their peak resident sets summed; 0: none yet)."""
        self._processes: list[BaseProcess] = []
        self._tasks: list[Queue[tuple[int, RunOptions] | None]] = []
        self._results: Queue[_Report] | None = None
        self._scratch: str | None = None
        self._done = 0
        self._next_id = 0

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return bool(self._processes)

    def resident_bytes(self) -> int:
        """What its ranks hold now (resident sets summed)."""
        return _memory_of(self.pids)[0]

    @property
    def pids(self) -> list[int]:
        """The ranks' process ids (empty when not running)."""
        return [process.pid for process in self._processes if process.pid is not None]

    def run(self, options: RunOptions, *, timeout_s: float) -> TaskOutcome:
        """Run ``worker(options)`` on every rank; rank 0's document, or the first failure, within ``timeout_s``.

        Starting the ranks, when they are not running, counts against ``timeout_s`` too.
        """
        started = time.monotonic()
        deadline = started + timeout_s
        start_s = 0.0
        if self.running and not all(map(alive, self.pids)):  # a rank died idle (the OOM killer): start afresh
            self.close()
        if not self.running:
            failure = self._start(deadline, timeout_s)
            start_s = time.monotonic() - started
            if failure is not None:
                self.close()
                return TaskOutcome("timeout" if "timed out" in failure else "failed", None,
                                   f"the pool's ranks did not start: {failure}", start_s, start_s)
        self._next_id += 1
        _memory_of(self.pids, reset_peak=True)
        for tasks in self._tasks:
            tasks.put((self._next_id, options))
        status, document, error = self._collect(self._next_id, deadline, timeout_s)
        self.last_peak_bytes = _memory_of(self.pids)[1] or self.last_peak_bytes
        self._done += 1
        if status != "ok" or self._done >= self.max_tasks:
            self.close()
        return TaskOutcome(status, document, error, time.monotonic() - started, start_s)

    def close(self) -> None:
        """Stop the ranks: politely when they are idle, SIGKILL for the rest; nothing stays behind."""
        for tasks in self._tasks:
            try:
                tasks.put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 2.0
        for process in (p for p in self._processes if p.pid is not None):  # started ones
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(5.0)
        for tasks in self._tasks:
            tasks.cancel_join_thread()
            tasks.close()
        if self._results is not None:
            self._results.cancel_join_thread()
            self._results.close()
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
        self._processes, self._tasks, self._results, self._scratch, self._done = [], [], None, None, 0

    def _start(self, deadline: float, timeout_s: float) -> str | None:
        import torch.multiprocessing as mp

        context = mp.get_context("forkserver")
        context.set_forkserver_preload(list(self.preload))
        self._scratch = tempfile.mkdtemp(prefix="parplan-pool-")
        rendezvous = f"file://{self._scratch}/rendezvous"
        self._results = context.Queue()
        self._tasks = [context.Queue() for _ in range(self.ranks)]
        self._processes = [
            context.Process(target=_rank_main, daemon=True, name=f"parplan-pool-rank-{rank}",
                            args=(rank, self.ranks, rendezvous, self._tasks[rank], self._results, os.getpid(),
                                  dict(os.environ), self.threads, self.group_timeout_s))
            for rank in range(self.ranks)]
        for process in self._processes:
            process.start()
        self.starts += 1
        status, _, error = self._collect(0, deadline, timeout_s)
        return None if status == "ok" else error

    def _collect(self, task_id: int, deadline: float,
                 timeout_s: float) -> tuple[TaskStatus, dict[str, object] | None, str]:
        """Every rank's report of ``task_id`` (0: ready); the first failure, a death or the deadline ends it."""
        results = self._results
        assert results is not None, "the ranks were started"
        reported: dict[int, dict[str, object] | str | None] = {}
        while len(reported) < self.ranks:
            try:
                rank, answered, status, payload = results.get(timeout=_POLL_S)
            except queue_module.Empty:
                dead = self._dead(reported)
                if dead:
                    return "failed", None, dead
                if time.monotonic() > deadline:
                    missing = sorted(set(range(self.ranks)) - set(reported))
                    return "timeout", None, f"timed out after {timeout_s:.0f} s (ranks {missing} still running)"
                continue
            if answered != task_id:
                continue  # a late report of an earlier task cannot happen after a restart; ignore it anyway
            if status != "ok":
                return status, None, self._first_failure(f"rank {rank}: {payload}")
            reported[rank] = payload
        document = reported.get(0)
        return "ok", document if isinstance(document, dict) else None, ""

    def _first_failure(self, reported: str) -> str:
        """``reported``, after a rank killed by a signal if one was (what the others saw was its death)."""
        until = time.monotonic() + _GRACE_S
        while time.monotonic() < until:
            killed = [(rank, p.exitcode) for rank, p in enumerate(self._processes)
                      if p.exitcode is not None and p.exitcode < 0]
            if killed:
                return f"{_signal_text(*killed[0])}; {reported}"
            time.sleep(_POLL_S / 4)
        return reported

    def _dead(self, reported: Mapping[int, object]) -> str:
        for rank, process in enumerate(self._processes):
            code = process.exitcode
            if rank not in reported and code is not None:
                return (_signal_text(rank, code) if code < 0
                        else f"rank {rank} exited with code {code} without reporting")
        return ""


class RankPools:
    """One :class:`RankPool` per group size, each started at its first task; ``close`` stops them all."""

    def __init__(self, *, threads: int = 1, group_timeout_s: float = 300.0, max_tasks: int = 64,
                 preload: Sequence[str] = ()) -> None:
        self._settings: _PoolSettings = {"threads": threads, "group_timeout_s": group_timeout_s,
                                         "max_tasks": max_tasks, "preload": tuple(preload)}
        self.pools: dict[int, RankPool] = {}

    def __enter__(self) -> RankPools:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def run(self, ranks: int, options: RunOptions, *, timeout_s: float) -> TaskOutcome:
        """``RankPool.run`` on the pool of ``ranks`` ranks.

        The idle pools of other sizes are stopped first when less than :data:`LOW_MEMORY_SHARE` of this machine's
        memory is available, or less than :data:`MEMORY_MARGIN` times what this pool grew by in its last task:
        their ranks hold the last model they ran, and restarting them costs a fork.
        """
        if ranks not in self.pools:
            self.pools[ranks] = RankPool(ranks, **self._settings)
        pool = self.pools[ranks]
        growth = max(0, pool.last_peak_bytes - pool.resident_bytes())
        if available_memory_share() < LOW_MEMORY_SHARE or available_memory_bytes() < MEMORY_MARGIN * growth:
            for size, pool in self.pools.items():
                if size != ranks:
                    pool.close()
        return self.pools[ranks].run(options, timeout_s=timeout_s)

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()


def available_memory_share() -> float:
    """``MemAvailable / MemTotal`` of ``/proc/meminfo``; 1.0 where it cannot be read."""
    fields = _meminfo_kib()
    return fields["MemAvailable"] / fields["MemTotal"] if fields.get("MemTotal") else 1.0


def available_memory_bytes() -> float:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes; infinite where it cannot be read."""
    return _meminfo_kib().get("MemAvailable", float("inf")) * 1024


def _meminfo_kib() -> dict[str, float]:
    try:
        with open("/proc/meminfo") as meminfo:
            return {key: float(value.split()[0]) for key, value in (line.split(":", 1) for line in meminfo)}
    except (OSError, ValueError, IndexError):
        return {}


def _memory_of(pids: Sequence[int], *, reset_peak: bool = False) -> tuple[int, int]:
    """The processes' resident and peak resident bytes, summed (``/proc/PID/status``: VmRSS, VmHWM; 0 where
    unreadable); with ``reset_peak``, each peak is then reset to its present size (``clear_refs``)."""
    resident = peak = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
            resident += int(fields["VmRSS"].split()[0]) * 1024
            peak += int(fields["VmHWM"].split()[0]) * 1024
            if reset_peak:
                with open(f"/proc/{pid}/clear_refs", "w") as clear:
                    clear.write("5")
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return resident, peak


def _release_memory() -> None:
    """Collect the last task's garbage and hand freed heap pages back to the kernel (glibc keeps them)."""
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _signal_text(rank: int, code: int) -> str:
    try:
        return f"rank {rank} died ({signal.Signals(-code).name})"
    except ValueError:
        return f"rank {rank} died (signal {-code})"


def _rank_main(rank: int, world: int, rendezvous: str, tasks: Queue[tuple[int, RunOptions] | None],
               results: Queue[_Report], parent: int, environ: dict[str, str], threads: int,
               group_timeout_s: float) -> None:
    """One rank: join the group, then run tasks until told to stop (``None``) or one fails."""
    take_environment(environ)
    die_with(parent)
    import torch
    import torch.distributed as dist

    from processes.cores import pin_rank
    from processes.heap import steady_heap

    torch.set_num_threads(threads)
    pin_rank(rank, world, threads)  # a pool's ranks are all on this host
    steady_heap()
    try:
        dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world,
                                timeout=timedelta(seconds=group_timeout_s))
    except BaseException as err:  # reported, then this rank ends
        _report_and_exit(results, _Report(rank, 0, "failed", one_line(err)))
    results.put(_Report(rank, 0, "ok", None))
    from runtime.train import worker

    while (item := tasks.get()) is not None:
        task_id, options = item
        try:
            document = worker(options)
        except BaseException as err:  # the parent tears the pool down: the group may be desynchronised
            status: TaskStatus = "refused" if type(err).__name__ in _INPUT_ERRORS else "failed"
            _report_and_exit(results, _Report(rank, task_id, status, one_line(err)))
        del options
        _release_memory()
        results.put(_Report(rank, task_id, "ok", document))
    dist.destroy_process_group()


def _report_and_exit(results: Queue[_Report], report: _Report) -> NoReturn:
    """Send ``report``, wait until it has left this process, and exit without tearing down (peers may be gone)."""
    results.put(report)
    results.close()
    results.join_thread()
    sys.stderr.flush()
    os._exit(1)


def one_line(err: BaseException) -> str:
    """``Type: first line of the message (at file:line in function)``, the frame the innermost of parplan's code."""
    text = str(err).strip().splitlines()
    where = ""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        path = frame.filename.replace(os.sep, "/")
        for package in ("runtime/", "cost_models/", "planner/"):
            if f"/{package}" in path:
                where = f" (at {package}{path.rsplit('/' + package, 1)[1]}:{frame.lineno} in {frame.name})"
                break
        if where:
            break
    return f"{type(err).__name__}: {text[0] if text else ''}{where}"
