"""Timing collectives inside a running torch.distributed job, as ``CommSample``s.

:func:`measure_collectives` runs on every rank of an already-initialised
default process group (gloo on CPU, nccl on GPU) and returns, on each rank, the
samples of the groups that rank belongs to; rank 0 belongs to all of them, so
its result is the complete one.

What is measured, and how:

* groups are the first ``g`` ranks for each requested ``g`` (``dist.new_group``,
  called on every rank in the same order); a group of one rank is left out, as
  it costs nothing (:func:`cost_models.collectives.comm_terms`);
* bytes follow :mod:`cost_models.collectives`: ``allreduce`` the buffer per
  rank, ``allgather`` the gathered output per rank, ``reduce_scatter`` the full
  input per rank, ``all_to_all`` each rank's send buffer, ``sendrecv`` one
  message. Buffers are float32; a size is rounded down to a multiple of
  ``4·g`` bytes where the collective splits it in ``g`` parts, and each sample
  records the bytes actually used;
* ``sendrecv`` pairs rank ``i`` with ``i + g//2`` (for ``g = 2`` that is 0↔1)
  and sends both ways at once (``batch_isend_irecv``), so both directions of
  every pair are busy; with an odd ``g`` the last rank idles. Pairing across
  the halves makes a group that spans hosts time the links between them;
* one run is: barrier over the group, ``perf_counter``, the operation, a device
  synchronise on GPU, elapsed. A run's time is the maximum over the group's
  ranks; a sample holds the median and interquartile range over ``repeats``
  runs, after ``warmup`` untimed ones;
* the link level is ``intra`` when every rank taking part (for ``sendrecv``:
  both ranks of every pair) runs on one node, otherwise ``inter``; a node is
  what the launcher calls one (torchrun's agent, Slurm's node id:
  ``processes.job.node_label``), else the host (``socket.gethostname()``),
  so two torchrun agents on one host measure the between-node level too;
* order: the sizes in two ascending passes (every other size, then the rest),
  and within a size every group and collective, so a short budget still gives
  every collective samples across the size range;
* the deadline (``time.monotonic()`` seconds) is judged on rank 0 alone and
  broadcast before every measurement (to all ranks) and before every timed run
  (to the group), so no rank enters a collective the others skip. A
  measurement cut short keeps the runs it made (its ``repeats`` says how
  many). Rank 0 also skips a measurement predicted to end past the deadline,
  from the secant through the smallest and largest sizes measured so far for
  the same collective and group (only their latency while one size is known),
  so a large size may be skipped while smaller ones of the second pass run;
* a collective the backend refuses (``RuntimeError`` or ``NotImplementedError``
  on a small probe over all ranks) is left out for the whole run and reported
  in :attr:`CommMeasurement.skipped` with the backend's message;
* a peer that dies or hangs (past ``timeout``, which the groups made here get;
  the default group's is its own) fails the waiting rank with a
  :class:`processes.rank_failures.RankFailure` of one line that names the
  collective being timed and the measurement (``rank 0: timed out after 4 s
  (a peer hung or is far behind) in the timed allreduce of 1024 bytes with
  rank 1 (measurement 3 of 34)``): every collective here runs inside
  :func:`processes.rank_failures.exchange`.

Assumptions: every rank calls :func:`measure_collectives` with the same
arguments; on nccl each rank has already selected its GPU
(``torch.cuda.set_device``), which ``all_gather_object`` needs too; a backend
that refuses a collective refuses it on every rank, before communicating;
durations are only measured within one rank, never across clocks.
"""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from cost_models.collectives import COLLECTIVES
from cost_models.errors import InputError
from cost_models.profile import CommSample
from processes.job import node_label
from processes.rank_failures import LOST, RankFailure, at, describe, exchange, place, reason

__all__ = ["DEFAULT_SIZES_BYTES", "CommMeasurement", "default_group_sizes", "measure_collectives"]

DEFAULT_SIZES_BYTES: tuple[int, ...] = tuple(1024 * 4**k for k in range(9))  # 1 KiB, 4 KiB, …, 64 MiB
_ELEMENT_BYTES = 4  # float32 buffers
_PROBE_ELEMENTS = 16  # per rank, for the support probe
_MAX_OPS_PER_RUN = 32
_BURST_BYTES = 4 * 2**20
_RUN, _SKIP, _STOP = 0, 1, 2  # rank 0's decision before each measurement

Operation = Callable[[], object]
Progress = Callable[[int, int], None]
BeforeMeasurement = Callable[[int, int], None]
"""Called as ``before(rank, measurement)`` (1-based) on every rank at the start of each planned measurement."""


@dataclass(frozen=True)
class CommMeasurement:
    """What one call of :func:`measure_collectives` timed.

    Attributes:
        samples: One per (collective, group, size) timed, in measurement order;
            on a rank other than 0 only those of the groups it belongs to.
        skipped: Collectives the backend refused, each with the reason.
        unfinished: Planned measurements left out because of the deadline.
        hosts: The host name of every rank, in rank order.
        backend: The process group's backend (``gloo``, ``nccl``, …).
    """

    samples: tuple[CommSample, ...]
    skipped: Mapping[str, str]
    unfinished: int
    hosts: tuple[str, ...]
    backend: str


@dataclass(frozen=True)
class _Context:
    """What every measurement on this rank needs besides the operation itself."""

    rank: int
    device: torch.device
    repeats: int
    warmup: int
    hosts: tuple[str, ...]
    deadline_s: float


@dataclass
class _Budget:
    """Rank 0's view of the deadline: whether the next measurement still fits."""

    deadline_s: float
    runs: int
    seen: dict[tuple[str, int], list[tuple[int, float]]] = field(default_factory=dict)

    def decide(self, collective: str, group: int, nbytes: int) -> int:
        """``_RUN``, ``_SKIP`` (predicted to overrun) or ``_STOP`` (deadline passed)."""
        now_s = time.monotonic()
        if now_s >= self.deadline_s:
            return _STOP
        return _SKIP if now_s + self.predict_s(collective, group, nbytes) > self.deadline_s else _RUN

    def predict_s(self, collective: str, group: int, nbytes: int) -> float:
        """Seconds of warm-up and timed runs: the secant through the smallest and largest sizes measured.

        With one size measured, its time (mostly latency) is the guess; with
        none, 0. Underestimates cost at most one run past the deadline, as
        every timed run asks rank 0 first.
        """
        points = sorted(self.seen.get((collective, group), []))
        if not points:
            return 0.0
        (small_bytes, small_s), (large_bytes, large_s) = points[0], points[-1]
        spread_bytes = large_bytes - small_bytes
        slope_s_per_byte = max(0.0, (large_s - small_s) / spread_bytes) if spread_bytes > 0 else 0.0
        return self.runs * ops_per_run(nbytes) * max(small_s, large_s + slope_s_per_byte * (nbytes - large_bytes))

    def record(self, sample: CommSample) -> None:
        """Remember a measured sample for later predictions."""
        self.seen.setdefault((sample.collective, sample.group), []).append((sample.bytes, sample.median_s))


def default_group_sizes(world_size: int) -> list[int]:
    """Powers of two from 2 up to ``world_size``, and ``world_size`` itself."""
    sizes = {2**k for k in range(1, max(world_size, 1).bit_length()) if 2**k <= world_size}
    return sorted(sizes | ({world_size} if world_size > 1 else set()))


def measure_collectives(
    sizes_bytes: Sequence[int],
    group_sizes: Sequence[int],
    collectives: Sequence[str],
    deadline_s: float,
    repeats: int = 5,
    warmup: int = 2,
    device: torch.device | None = None,
    progress: Progress | None = None,
    *,
    timeout: timedelta | None = None,
    before_measurement: BeforeMeasurement | None = None,
) -> CommMeasurement:
    """Time each collective on each group of the first ``g`` ranks at each size, until ``deadline_s``.

    Must be called on every rank of the default process group, with the same
    arguments (see the module docstring for what is timed and in which order).

    Args:
        sizes_bytes: Message sizes, as defined per collective in :mod:`cost_models.collectives`.
        group_sizes: Group sizes ``g`` (each ``1 <= g <= world size``; ``g = 1`` is left out).
        collectives: Names from :data:`cost_models.collectives.COLLECTIVES`.
        deadline_s: A ``time.monotonic()`` time after which no measurement and no timed run starts.
        repeats: Timed runs per sample (>= 1).
        warmup: Untimed runs before them (>= 0).
        device: Where buffers live; default the current GPU on nccl, else the CPU.
        progress: Called on every rank as ``progress(done, planned)`` after each
            planned measurement, timed or skipped.
        timeout: How long the groups made here wait for a peer (``None``: torch's default for the backend).
        before_measurement: Called on every rank as ``before_measurement(rank, measurement)`` (1-based) at the
            start of each planned measurement, before rank 0's go-ahead (``parplan calibrate``'s fault injection).

    Returns:
        The samples, the collectives the backend refused, and what the deadline cut.

    Raises:
        InputError: An argument is out of range or names an unknown collective.
        RankFailure: A peer died or hung past the timeout; the message names the collective and the measurement.
        RuntimeError: No default process group is initialised.
    """
    _check_arguments(sizes_bytes, group_sizes, collectives, repeats, warmup)
    collectives = list(dict.fromkeys(collectives))  # each once, in the order given
    context = _Context(dist.get_rank(), device or _default_device(), repeats, warmup, _gather_hosts(), deadline_s)
    groups = _make_groups(sorted({g for g in group_sizes if g > 1}), timeout)
    skipped = _refused(collectives, context)
    plan = [
        (nbytes, g, collective)
        for nbytes in _size_order(sizes_bytes)
        for g in groups
        for collective in collectives
        if collective not in skipped
    ]
    budget = _Budget(deadline_s, repeats + warmup)
    samples, unfinished = _run_plan(plan, groups, context, budget, progress, before_measurement)
    return CommMeasurement(tuple(samples), skipped, unfinished, context.hosts, str(dist.get_backend()))


def _check_arguments(
    sizes_bytes: Sequence[int], group_sizes: Sequence[int], collectives: Sequence[str], repeats: int, warmup: int
) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("measure_collectives needs an initialised default process group (dist.init_process_group)")
    world_size = dist.get_world_size()
    unknown = [c for c in collectives if c not in COLLECTIVES]
    if unknown:
        raise InputError(f"unknown collectives {unknown}; known: {', '.join(COLLECTIVES)}")
    if not sizes_bytes or min(sizes_bytes) <= 0:
        raise InputError(f"sizes_bytes must be positive and non-empty, got {list(sizes_bytes)}")
    if any(g < 1 or g > world_size for g in group_sizes):
        raise InputError(f"group sizes must lie in 1..{world_size} (the world size), got {list(group_sizes)}")
    if repeats < 1 or warmup < 0:
        raise InputError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")


def _default_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _gather_hosts() -> tuple[str, ...]:
    hosts: list[object] = [None] * dist.get_world_size()
    with exchange("the gathering of the ranks' host names", range(len(hosts))):
        dist.all_gather_object(hosts, node_label(socket.gethostname()))
    return tuple(str(host) for host in hosts)


def _make_groups(group_sizes: Sequence[int], timeout: timedelta | None) -> dict[int, dist.ProcessGroup | None]:
    """``g`` → the group of ranks ``0..g-1``, or None on a rank outside it; made on every rank alike."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    groups: dict[int, dist.ProcessGroup | None] = {}
    for g in group_sizes:
        group: dist.ProcessGroup | int | None  # (``new_group`` gives a rank outside the group a marker int)
        if g == world_size:
            group = dist.group.WORLD
        else:
            with exchange(f"creating the process group of ranks 0–{g - 1}", range(world_size)):
                group = dist.new_group(ranks=list(range(g)), timeout=timeout)
        groups[g] = group if rank < g and isinstance(group, dist.ProcessGroup) else None
    return groups


def _size_order(sizes_bytes: Sequence[int]) -> list[int]:
    """Every other size ascending, then the rest ascending: the whole range early, detail later."""
    ordered = sorted(set(int(s) for s in sizes_bytes))
    return ordered[0::2] + ordered[1::2]


def _refused(collectives: Sequence[str], context: _Context) -> dict[str, str]:
    """Probe each collective over all ranks once; those refused on any rank, with the reason."""
    world_size = dist.get_world_size()
    refused: dict[str, str] = {}
    for collective in collectives:
        why = _probe(collective, world_size, context)
        flag = torch.tensor([0 if why else 1], dtype=torch.int64, device=context.device)
        with exchange(f"the check that every rank can run {collective}", range(world_size)):
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            if int(flag.item()) == 0:
                refused[collective] = why or "refused by the backend on another rank"
    return refused


def _probe(collective: str, world_size: int, context: _Context) -> str:
    """Empty string if one small ``collective`` over all ranks works here, else the error's first line."""
    try:
        probe_bytes = _PROBE_ELEMENTS * world_size * _ELEMENT_BYTES
        operation, _ = _make_operation(collective, world_size, dist.group.WORLD, probe_bytes, context)
        operation()
        _synchronize(context.device)
    except (RuntimeError, NotImplementedError) as error:
        if isinstance(error, RuntimeError) and (reason(error) == LOST or reason(error).startswith("timed out")):
            raise RankFailure(describe(f"the trial {collective}", range(world_size), place(), error)) from error
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return ""


def _run_plan(
    plan: Sequence[tuple[int, int, str]],
    groups: Mapping[int, dist.ProcessGroup | None],
    context: _Context,
    budget: _Budget,
    progress: Progress | None,
    before_measurement: BeforeMeasurement | None = None,
) -> tuple[list[CommSample], int]:
    samples: list[CommSample] = []
    unfinished = 0
    world = range(dist.get_world_size())
    for index, (nbytes, g, collective) in enumerate(plan):
        if before_measurement is not None:
            before_measurement(context.rank, index + 1)
        timed = f"the timed {collective} of {nbytes} bytes"
        with at(f"measurement {index + 1} of {len(plan)}"):
            decision = budget.decide(collective, g, nbytes) if context.rank == 0 else _RUN
            with exchange(f"the go-ahead for {timed}", world):
                decision = _agree(decision, context.device)
            if decision == _STOP:
                return samples, unfinished + len(plan) - index
            if decision == _SKIP:
                unfinished += 1
            elif groups[g] is not None:
                with exchange(timed, range(g)):
                    sample = _measure_one(collective, g, groups[g], nbytes, context)
                if sample is None:
                    unfinished += 1
                else:
                    samples.append(sample)
                    budget.record(sample)
        if progress is not None:
            progress(index + 1, len(plan))
    return samples, unfinished


def _agree(decision: int, device: torch.device, group: dist.ProcessGroup | None = None) -> int:
    """Rank 0's decision, broadcast to every rank of ``group`` (default: all ranks; rank 0 is in every group)."""
    flag = torch.tensor([decision], dtype=torch.int64, device=device)
    dist.broadcast(flag, src=0, group=group)
    return int(flag.item())


def _measure_one(
    collective: str, g: int, group: dist.ProcessGroup | None, nbytes: int, context: _Context
) -> CommSample | None:
    """One sample over ``group`` (this rank is a member); None if the deadline left no timed run."""
    operation, used_bytes = _make_operation(collective, g, group, nbytes, context)
    for _ in range(context.warmup):
        operation()
    _synchronize(context.device)
    elapsed_s: list[float] = []
    per_run = ops_per_run(used_bytes)
    while len(elapsed_s) < context.repeats and _in_time(context, group):
        elapsed_s.append(_timed_run(operation, group, context.device, per_run) / per_run)
    if not elapsed_s:
        return None
    slowest = torch.tensor(elapsed_s, dtype=torch.float64, device=context.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    median_s, iqr_s = _median_iqr(slowest.cpu().tolist())
    level = _level(collective, g, context.hosts)
    return CommSample(collective, level, g, used_bytes, median_s, iqr_s, len(elapsed_s) * per_run)


def ops_per_run(nbytes: int) -> int:
    """Back-to-back operations per timed run: 16 for small messages, falling to 1 from 2 MiB.

    Timing a short burst and dividing (as nccl-tests and the OSU benchmarks
    do) measures the steady per-operation time and spreads the barrier's skew
    and a busy host's scheduling stalls over the burst instead of letting them
    decide a small message's median.
    """
    return max(1, min(_MAX_OPS_PER_RUN, _BURST_BYTES // max(nbytes, 1)))


def _in_time(context: _Context, group: dist.ProcessGroup | None) -> bool:
    """Whether rank 0 sees time left before the deadline, agreed over ``group``."""
    decision = _RUN if context.rank != 0 or time.monotonic() < context.deadline_s else _STOP
    return _agree(decision, context.device, group) == _RUN


def _timed_run(operation: Operation, group: dist.ProcessGroup | None, device: torch.device, count: int = 1) -> float:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        dist.barrier(group=group, device_ids=[index])
        torch.cuda.synchronize(device)
    else:
        dist.barrier(group=group)
    start_s = time.perf_counter()
    for _ in range(count):
        operation()
    _synchronize(device)
    return time.perf_counter() - start_s


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_iqr(times_s: Sequence[float]) -> tuple[float, float]:
    if len(times_s) < 2:
        return float(times_s[0]), 0.0
    quartiles = statistics.quantiles(times_s, n=4, method="inclusive")
    return float(statistics.median(times_s)), float(quartiles[2] - quartiles[0])


def _level(collective: str, g: int, hosts: Sequence[str]) -> str:
    """``intra`` when every rank taking part shares one host, else ``inter``."""
    if collective == "sendrecv":
        half = g // 2
        return "inter" if any(hosts[i] != hosts[i + half] for i in range(half)) else "intra"
    return "intra" if len(set(hosts[:g])) == 1 else "inter"


def _sendrecv_peer(rank: int, g: int) -> int | None:
    """Rank ``i`` pairs with ``i + g//2``; the last rank of an odd group has no peer."""
    half = g // 2
    if rank < half:
        return rank + half
    return rank - half if rank < 2 * half else None


def _zeros(elements: int, device: torch.device) -> torch.Tensor:
    return torch.zeros(elements, dtype=torch.float32, device=device)


def _elements(nbytes: int, parts: int) -> int:
    """Float32 elements in ``nbytes``, a positive multiple of ``parts``."""
    return max(parts, nbytes // _ELEMENT_BYTES // parts * parts)


def _make_operation(
    collective: str, g: int, group: dist.ProcessGroup | None, nbytes: int, context: _Context
) -> tuple[Operation, int]:
    """One call of ``collective`` over ``group`` (ready buffers), and the bytes it uses by our convention."""
    device = context.device
    if collective == "allreduce":
        buffer = _zeros(_elements(nbytes, 1), device)
        return (lambda: dist.all_reduce(buffer, group=group)), buffer.numel() * _ELEMENT_BYTES
    if collective == "sendrecv":
        return _sendrecv_operation(_sendrecv_peer(context.rank, g), _elements(nbytes, 1), device)
    full = _zeros(_elements(nbytes, g), device)
    part = _zeros(full.numel() // g, device)
    used_bytes = full.numel() * _ELEMENT_BYTES
    if collective == "allgather":
        return (lambda: _all_gather()(full, part, group=group)), used_bytes
    if collective == "reduce_scatter":
        return (lambda: _reduce_scatter()(part, full, group=group)), used_bytes
    received = torch.empty_like(full)
    return (lambda: dist.all_to_all_single(received, full, group=group)), used_bytes


def _sendrecv_operation(peer: int | None, elements: int, device: torch.device) -> tuple[Operation, int]:
    used_bytes = elements * _ELEMENT_BYTES
    if peer is None:
        return (lambda: None), used_bytes
    outgoing, incoming = _zeros(elements, device), _zeros(elements, device)
    operations = [dist.P2POp(dist.isend, outgoing, peer), dist.P2POp(dist.irecv, incoming, peer)]

    def exchange() -> None:
        for work in dist.batch_isend_irecv(operations):
            work.wait()

    return exchange, used_bytes


def _all_gather() -> Callable[..., object]:
    """``all_gather_single`` where torch has it (newer name), else ``all_gather_into_tensor``."""
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _reduce_scatter() -> Callable[..., object]:
    """``reduce_scatter_single`` where torch has it (newer name), else ``reduce_scatter_tensor``."""
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
