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

The search's layer-cost rows computed ahead (:func:`rows_ahead`), taken as they arrive. A search prices each
decision's layouts (``LayerCosts.rows``) in several tables: the one-stage space on all ``D`` devices, then — the
bulk at many devices — the stale stages' on each stage size ``s`` of the full budget (the whole batch, its forward
recomputed). None depends on another, so a helper process computes them meanwhile, in the order the planner asks
last: the one-stage table from its last decision back (the planner builds it from the first), then the stale tables
decision by decision, lightest first, every size in turn (the search's bounds sum them heaviest first). Through
:meth:`RowsAhead.arrivals` the planner takes a row the helper sent before making it itself, and marks each one it
makes as its own in an array both processes share, which the helper skips — so they meet in the middle, each row
made once. The rows are the same values either way: the helper's tables are built as the search builds its own (the
same graph, profile, stage cluster, counts).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import warnings
from collections.abc import Callable, Hashable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Generic, TypeVar

from cost_models.cluster import Cluster, stage_cluster
from cost_models.estimate import CostMemo
from cost_models.profile import Profile
from planner.edge_costs import has_volumes
from planner.layout_space import space_size
from planner.pipeline.bounds import heaviest_first
from planner.pipeline.sizes import sizes_for, stage_sizes
from planner.settings import SearchSettings
from planner.space import DecisionRow, LayerCosts, decision_groups

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["Ahead", "Produce", "RowsAhead", "ahead", "rows_ahead"]


__all__ = ["Ahead", "Produce", "ahead"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
Send = Callable[[K, V], None]
Produce = Callable[[Send[K, V]], None]
"""``produce(send)``: compute values and ``send(key, value)`` each (in the helper process)."""

_NICENESS = 19  # added to the helper's priority where it cannot be SCHED_IDLE
_PIPE_BYTES = 1 << 20  # Linux's default pipe-max-size


class Ahead(Generic[K, V]):
    """The planner's end of one helper process (module docstring)."""

    def __init__(self, process: BaseProcess, connection: Connection) -> None:
        self.process, self.connection = process, connection
        self.open = True

    def arrived(self) -> list[tuple[K, V]]:
        """The ``(key, value)`` pairs sent since the last call, without waiting for more."""
        found: list[tuple[K, V]] = []
        try:
            while self.open and self.connection.poll():
                found.append(self.connection.recv())
        except (EOFError, OSError):  # the helper ended (all sent, or it failed)
            self.open = False
        return found

    def close(self) -> None:
        """End the helper (if still running), reap it and close the pipe.

        SIGKILL, not SIGTERM: the helper holds nothing to release (its end of the pipe, a lock-free shared
        array), and a SIGTERM handler it inherited from the planner's process (torch's elastic agent leaves one;
        a training script may install its own) could keep it computing while this waits for it."""
        self.open = False
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.connection.close()


def ahead(produce: Produce[K, V]) -> Ahead[K, V] | None:
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
        import fcntl

        fcntl.fcntl(connection.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except (ImportError, AttributeError, OSError):  # not POSIX, not Linux, or above this system's pipe-max-size
        pass


def _may_fork() -> bool:
    if "fork" not in multiprocessing.get_all_start_methods() or multiprocessing.parent_process() is not None:
        return False
    if multiprocessing.current_process().daemon:
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores >= 2


def _helper(produce: Produce[K, V], connection: Connection) -> None:
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
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.nice(_NICENESS)
        except OSError:
            pass


LEAST_WORK = 4000
"""Layouts × decisions to compute ahead, at least, for a helper to pay for its fork (ResNet-50 on 1024 devices:
about 18,000; a test's ResNet-18 on 8: a few hundred)."""

_Table = tuple[int, bool]  # devices, recomputing (the whole batch, one copy of its activations)


class RowsAhead:
    """The planner's side (module docstring): rows received, rows claimed, and the helper."""

    def __init__(self, graph: LayerGraph, cluster: Cluster, jobs: list[tuple[_Table, tuple[str, ...]]]) -> None:
        self.graph, self.cluster, self.jobs = graph, cluster, jobs
        self.index = {job: position for position, job in enumerate(jobs)}
        self.claimed = multiprocessing.RawArray("b", len(jobs))  # 1: the planner makes it (the helper skips it)
        self.received: dict[int, list[DecisionRow]] = {}
        self.helper: Ahead[int, list[DecisionRow]] | None = None
        self.taken = 0

    def arrivals(self, costs: LayerCosts, members: tuple[str, ...]) -> list[DecisionRow] | None:
        """``LayerCosts.arrivals``: the helper's rows of ``members`` under ``costs``, else ``None`` (claimed)."""
        table = self._table(costs) if costs.graph is self.graph else None
        position = None if table is None else self.index.get((table, members))
        if position is None or self.helper is None:
            return None
        self.gather()
        found = self.received.pop(position, None)
        if found is None:
            self.claimed[position] = 1
        self.taken += found is not None
        return found

    def gather(self) -> bool:
        """Take in the rows sent so far, without waiting; whether the helper may send more."""
        if self.helper is None:
            return False
        for position, rows in self.helper.arrived():
            self.received[position] = rows
        return self.helper.open

    def close(self) -> None:
        """End the helper."""
        if self.helper is not None:
            self.helper.close()

    def _table(self, costs: LayerCosts) -> _Table | None:
        whole = costs.saved_copies == 1 and costs.smallest is None
        return (costs.devices, costs.recompute) if whole and costs.cluster == _cluster_of(self.cluster, costs.devices) \
            else None


def _cluster_of(cluster: Cluster, devices: int) -> Cluster:
    """The cluster a table on ``devices`` devices is priced on: the whole, or a stage's."""
    return cluster if devices == cluster.devices else stage_cluster(cluster, devices)


def rows_ahead(graph: LayerGraph, profile: Profile, cluster: Cluster, settings: SearchSettings, memo: CostMemo,
               *, least: int | None = None) -> RowsAhead | None:
    """Start the helper of a search (module docstring); ``None`` where it would have fewer than ``least`` layouts ×
    decisions to price (default :data:`LEAST_WORK`), or where there can be no helper (``planner.ahead``)."""
    groups = decision_groups(graph)
    tables = [(cluster.devices, False)] + [(size, True) for size in _stale_sizes(graph, cluster, settings)]
    volume = has_volumes(graph)
    work = len(groups) * sum(space_size(size, volume=volume, per_node=min(cluster.devices_per_node, size))
                             for size, _ in tables)
    if work < (LEAST_WORK if least is None else least):
        return None
    lightest = heaviest_first(graph, groups)[::-1]
    jobs = [(tables[0], groups[head]) for head in reversed(groups)]
    jobs += [(table, groups[head]) for head in lightest for table in tables[1:]]
    try:
        side = RowsAhead(graph, cluster, jobs)
    except OSError:  # no shared memory to be had: no helper
        return None
    side.helper = ahead(_producer(graph, profile, cluster, settings.optimizer, memo, side, groups))
    return side if side.helper is not None else None


def _stale_sizes(graph: LayerGraph, cluster: Cluster, settings: SearchSettings) -> list[int]:
    """The stage sizes of the stale configurations on the full budget (``planner.pipeline.stages``), largest first."""
    if settings.max_stages < 2 or settings.schedule == "sync" or settings.max_staleness == 0:
        return []
    everything = stage_sizes(cluster, graph)
    return sorted({size for stages in range(2, settings.max_stages + 1)
                   for size in sizes_for(stages, cluster.devices, everything)}, reverse=True)


def _producer(graph: LayerGraph, profile: Profile, cluster: Cluster, optimizer: str, memo: CostMemo,
              side: RowsAhead, groups: dict[str, tuple[str, ...]]) -> Produce[int, list[DecisionRow]]:
    """The helper's work: each job not claimed, in order, sent by its position."""
    def produce(send: Send[int, list[DecisionRow]]) -> None:
        made: dict[_Table, LayerCosts] = {}
        for position, ((devices, recompute), members) in enumerate(side.jobs):
            if side.claimed[position]:
                continue
            if (devices, recompute) not in made:
                made[devices, recompute] = LayerCosts(graph, profile, _cluster_of(cluster, devices), devices,
                                                      optimizer, memo=memo, recompute=recompute, groups=groups)
            send(position, made[devices, recompute].rows(members))
    return produce
