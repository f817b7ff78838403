"""What-if analysis: the best plan, and its baselines, at each cluster size of a sweep.

For every device count ``D`` the planner runs as ``parplan plan`` would
(``planner.search.plan_model``: the exact one-stage optimum, pipelines up to
``max_stages``, and the two baselines), on a cluster derived from the base
one — ``D`` devices grouped as the base cluster's nodes, links and memory
optionally scaled (:func:`scaled_profile`). Sizes run in parallel processes.

* Strong scaling (default): the global batch stays the input shape's.
* Weak scaling: the input shape's batch is per device; at ``D`` devices the
  global batch is ``D`` times it (the model is traced again per size).

Under strong scaling a size may leave devices idle: its own search's pipelines
may use half, a quarter … of them (``planner.pipeline.sizes.budgets``), and where
a smaller size of the sweep still has a faster plan (a one-stage plan, which
the search does not shrink), that plan is the row's, on ``devices_used`` of
the ``D`` devices (the rest idle: ``parplan plan --devices`` that count makes
it), so a sweep never gets slower with more devices (:func:`with_idle`).
Splitting a small batch ever finer costs more halo, redistribution and
allreduce than it saves in compute; copies (``cost_models.formats.plan``) cannot
avoid that, idle devices can.

Each :class:`WhatIfRow` holds the best plan's predicted iteration time,
samples per second, memory per device and one-line plan, the best one-stage
plan's time (sample × spatial × channel, no pipeline) and pure sample
parallelism's (on at most as many devices as the batch has samples, the
rest idle: ``planner.search.sample_cluster``; past the batch size its time
stops improving). Under strong scaling both baselines, like the plan, are
the best of the sizes up to ``D``: no curve rises with more devices. Speedup
and efficiency compare throughput (samples per second) with one device
running the whole model unsplit at the input shape's batch — predicted even
when it would not fit in one device's memory (:func:`one_device`), so that
every size has the same reference; for strong scaling that is the ratio of
iteration times. A size where nothing fits, or that cannot be split, is a row
with ``feasible=False`` and the reason. Sizes that cannot fit even if the
model were split perfectly (every resident tensor — weights, gradients,
optimizer state, saved activations — held once, in ``D`` equal parts) are not
searched at all. Transient workspace is left out of that bound: micro-batches
shrink it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from cost_models.cluster import Cluster
from cost_models.errors import InputError, PlanError
from cost_models.profile import Profile
from planner.settings import Progress, SearchSettings

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["OneDevice", "WhatIfRow", "one_device", "scaled_profile", "sweep", "with_idle", "with_speedups"]

GraphFor = Callable[[int], "LayerGraph"]  # global batch -> the model traced at it
_Job = tuple["LayerGraph", Profile, Cluster, SearchSettings, str]  # one size's search: _row's arguments


@dataclass(frozen=True)
class WhatIfRow:
    """One cluster size of a sweep (see the module docstring); times in seconds, ``None`` where infeasible."""

    devices: int
    batch: int
    feasible: bool
    reason: str = ""
    iteration_s: float | None = None
    samples_per_s: float | None = None
    memory_bytes: int | None = None
    plan: str = ""
    stages: int = 1
    one_stage_s: float | None = None
    pure_sample_s: float | None = None
    pure_sample_samples_per_s: float | None = None
    sample_parallel: int = 1
    speedup: float | None = None
    efficiency: float | None = None
    speedup_vs_sample: float | None = None
    search_s: float = 0.0
    found_at: int | None = None
    """The size of the sweep whose own search found the plan (``devices`` unless :func:`with_idle` took a smaller
    size's); ``None`` in an infeasible row."""
    devices_used: int | None = None
    """Devices the plan runs on (the rest idle: its own search's pipeline budget, or :func:`with_idle`); ``None``
    in an infeasible row."""

    def to_dict(self) -> dict[str, object]:
        """A plain dict (JSON and CSV rows)."""
        return asdict(self)


@dataclass(frozen=True)
class OneDevice:
    """The reference: the whole model unsplit on one device, and whether it fits there."""

    batch: int
    iteration_s: float
    memory_bytes: int
    fits: bool
    resident_bytes: int
    """Weights, optimizer state, and the larger of the gradients (all alive after backward) and one sample's
    activations kept for backward (a pipeline of one-sample micro-batches holds at least those once its first
    micro-batch reaches the last stage): what no split can hold less of in all at some moment."""

    @property
    def samples_per_s(self) -> float:
        """Throughput of the reference."""
        return self.batch / self.iteration_s


def one_device(graph: LayerGraph, profile: Profile, cluster: Cluster) -> OneDevice:
    """Predict the unsplit model on one device of ``cluster`` (memory is reported, not enforced)."""
    from cost_models.estimate import estimate
    from cost_models.layout import Layout
    from cost_models.uniform import uniform_plan

    single = replace(cluster, devices=1, devices_per_node=1)
    predicted = estimate(graph, uniform_plan(graph, single, [Layout()]), profile)
    terms = predicted.memory_bytes  # all gradients exist after backward; one sample's activations at least once
    resident = terms["weights"] + terms["optimizer"] + max(terms["gradients"], terms["saved"] // graph.input_shape[0])
    return OneDevice(int(graph.input_shape[0]), predicted.iteration_s, predicted.memory_bytes_max,
                     predicted.memory_bytes_max <= cluster.memory_bytes, resident)


def scaled_profile(profile: Profile, intra_bw: float = 1.0, inter_bw: float = 1.0,
                   memory_bytes: int | None = None) -> Profile:
    """``profile`` with its links' bandwidth multiplied per level and, optionally, another device memory.

    Latencies are kept; a profile without an inter-node fit first gets the intra-node one for it (the
    fallback ``Profile.comm_time_s`` applies).

    Raises:
        InputError: A factor that is not positive.
    """
    for name, factor in (("intra-node", intra_bw), ("inter-node", inter_bw)):
        if not factor > 0:
            raise InputError(f"the {name} bandwidth factor must be > 0, got {factor}")
    fits = {(fit.collective, fit.level): fit for fit in profile.comm_fits}
    for (collective, level), fit in list(fits.items()):
        if level == "intra" and (collective, "inter") not in fits:
            fits[(collective, "inter")] = replace(fit, level="inter")
    factors = {"intra": intra_bw, "inter": inter_bw}
    scaled = tuple(replace(fit, beta_s_per_byte=fit.beta_s_per_byte / factors[fit.level]) for fit in fits.values())
    device = replace(profile.device, memory_bytes=memory_bytes) if memory_bytes else profile.device
    return replace(profile, comm_fits=scaled, device=device)


def sweep(graph_for: GraphFor, profile: Profile, cluster_for: Callable[[int], Cluster], devices: Sequence[int],
          batch: int, settings: SearchSettings, *, weak: bool = False, jobs: int | None = None,
          model_spec: str = "", progress: Progress | None = None) -> tuple[list[WhatIfRow], OneDevice]:
    """One row per device count, with speedups against one device (module docstring), and that reference.

    Args:
        graph_for: The model traced at a global batch.
        cluster_for: The cluster of ``D`` devices.
        batch: The input shape's batch: global (strong scaling) or per device (``weak``).
        jobs: Processes to plan in (default: the machine's cores, at most the sizes).
        progress: Told ``(done, total)`` as sizes finish.
    """
    sizes = sorted(set(devices))
    work: list[_Job] = [(graph_for(batch * d if weak else batch), profile, cluster_for(d), settings, model_spec)
                        for d in sizes]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(work)))
    told = progress or (lambda done, total: None)
    rows: list[WhatIfRow] = []
    told(0, len(work))
    if jobs == 1:
        for item in work:
            rows.append(_row(*item))
            told(len(rows), len(work))
    else:
        with ProcessPoolExecutor(jobs) as pool:
            for row in as_completed([pool.submit(_row, *item) for item in _largest_first(work)]):
                rows.append(row.result())
                told(len(rows), len(work))
    rows.sort(key=lambda row: row.devices)
    reference = one_device(graph_for(batch), profile, cluster_for(1))
    return with_speedups(rows if weak else with_idle(rows), reference), reference


def with_idle(rows: Sequence[WhatIfRow]) -> list[WhatIfRow]:
    """Strong scaling: each feasible row with the fastest plan of its size or a smaller one (the devices it does
    not use idle), and so with its baselines (pure sample, best one stage): each the best on at most that many
    devices; rows in increasing device order."""
    found: list[WhatIfRow] = []
    best: WhatIfRow | None = None
    sample: WhatIfRow | None = None
    one_stage: float | None = None
    for row in sorted(rows, key=lambda each: each.devices):
        if not row.feasible:
            found.append(row)
            continue
        if best is None or _time_s(row) <= _time_s(best):
            best = row  # of equal plans, the size's own (its search may leave the same devices idle)
        sample_s = None if sample is None else sample.pure_sample_s  # (set only where a row has one)
        if row.pure_sample_s is not None and (sample_s is None or row.pure_sample_s < sample_s):
            sample = row
        if row.one_stage_s is not None and (one_stage is None or row.one_stage_s < one_stage):
            one_stage = row.one_stage_s
        found.append(replace(row, iteration_s=best.iteration_s, samples_per_s=best.samples_per_s,
                             memory_bytes=best.memory_bytes, plan=best.plan, stages=best.stages,
                             devices_used=best.devices_used, found_at=best.found_at, one_stage_s=one_stage,
                             pure_sample_s=sample.pure_sample_s if sample else None,
                             pure_sample_samples_per_s=sample.pure_sample_samples_per_s if sample else None,
                             sample_parallel=sample.sample_parallel if sample else row.sample_parallel))
    return found


def with_speedups(rows: Sequence[WhatIfRow], reference: OneDevice) -> list[WhatIfRow]:
    """The rows with speedup and efficiency against ``reference``'s throughput, and against pure sample."""
    found = []
    for row in rows:
        if not row.feasible:
            found.append(row)
            continue
        assert row.samples_per_s is not None, f"a feasible row has a throughput: {row}"
        speedup = row.samples_per_s / reference.samples_per_s
        versus = row.pure_sample_s / _time_s(row) if row.pure_sample_s else None
        found.append(replace(row, speedup=speedup, efficiency=speedup / row.devices, speedup_vs_sample=versus))
    return found


def _time_s(row: WhatIfRow) -> float:
    """A feasible row's iteration seconds."""
    assert row.iteration_s is not None, f"a feasible row has an iteration time: {row}"
    return row.iteration_s


def _largest_first(work: list[_Job]) -> list[_Job]:
    """Longest jobs first (larger clusters take longer), so that the pool ends together."""
    return sorted(work, key=lambda item: -item[2].devices)


def _row(graph: LayerGraph, profile: Profile, cluster: Cluster, settings: SearchSettings, model_spec: str) -> WhatIfRow:
    """Plan one size; a size with no feasible plan becomes a row saying why."""
    from planner.search import plan_model

    batch = int(graph.input_shape[0])
    whole = one_device(graph, profile, cluster)
    if whole.resident_bytes / cluster.devices > cluster.memory_bytes:  # no split can beat a perfect one
        return WhatIfRow(cluster.devices, batch, False, reason=(
            f"does not fit: even split perfectly the model needs {whole.resident_bytes / cluster.devices / 2**30:.2f} "
            f"GiB per device ({whole.resident_bytes / 2**30:.2f} GiB resident on one), the devices have "
            f"{cluster.memory_bytes / 2**30:.2f} GiB"))
    try:
        searched = replace(settings, max_stages=1) if cluster.devices == 1 else settings
        result = plan_model(graph, profile, cluster, searched, model_spec=model_spec)
    except (InputError, PlanError) as err:
        return WhatIfRow(cluster.devices, batch, False, reason=str(err).split(";")[0])
    predicted = result.estimate
    sample = next((b for b in result.baselines if b.name == "pure sample"), None)
    sample_s = (sample.estimate.iteration_s  # where it fits
                if sample is not None and sample.estimate.memory_bytes_max <= cluster.memory_bytes else None)
    one_stage = [c.iteration_s for c in result.considered if c.fits and c.summary.endswith("1 stage")]
    one_stage += [b.estimate.iteration_s for b in result.baselines
                  if b.estimate.memory_bytes_max <= cluster.memory_bytes]
    return WhatIfRow(
        devices=cluster.devices, batch=batch, feasible=True, iteration_s=predicted.iteration_s,
        samples_per_s=batch / predicted.iteration_s, memory_bytes=predicted.memory_bytes_max,
        plan=result.plan.summary(), stages=result.plan.pipeline.stages, one_stage_s=min(one_stage, default=None),
        pure_sample_s=sample_s,
        pure_sample_samples_per_s=batch / sample_s if sample_s is not None else None,
        sample_parallel=sample.plan.cluster.devices if sample is not None else 1,
        search_s=result.search_s, devices_used=sum(result.plan.pipeline.devices_per_stage),
        found_at=cluster.devices)
