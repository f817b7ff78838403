"""``parplan validate --refine``: fit a profile's corrections to measured runs, and test them on runs left out.

The fit (:func:`fit_corrections`) has two steps, each a closed form:

1. **Layer factors** (from per-layer measurements, ``--per-layer``): for each
   layer key (kind and split, ``cost_models.corrections.layer_key``) the
   ratio of the measured seconds to the predicted ones, summed over every
   layer of that key in every run (per batch: a sync pipeline's ``M``
   micro-batches, a stale one's forward twice, :func:`local_s`) — measured is the layer's forward
   plus backward less the predicted redistribution into it (the cost model
   prices that on the edge, the profiler sees it inside the layer), predicted
   is its compute, exposed halo, norm statistics and channel reduction. The
   ratios are shrunk towards their parent's (key → its split's pooled key
   ``*·spatial`` … → ``*``, all layers): ``(Σ measured + λ·parent) /
   (Σ predicted + λ)`` with λ a fifth of a run's predicted layer
   seconds, so a key seen on a few small layers stays near its parent.
2. **Whole-run terms**, by bounded linear least squares on relative residuals
   (``scipy.optimize.lsq_linear``) over the runs, each weighted by
   ``1/(σ² + 0.05²)`` with ``σ`` its measurement's relative standard error
   (a noisy run counts less; none counts more than a 5% model error allows): a common factor ``a`` on all
   layer factors, seconds per iteration (``step_overhead_s``), seconds per
   pipeline event (``event_overhead_s``, fitted only when a pipeline is among
   the runs) and the share of the modelled-hidden allreduce that is exposed
   (``allreduce_exposed_fraction``, in [0, 1], fitted only when a run hides
   some). The estimate is linear in the last three and nearly so in ``a``;
   the derivatives are taken by finite differences of the full estimate and
   the step is repeated once from the first solution (Gauss–Newton).

With ``split_layers_only`` (``parplan calibrate``'s split forms) only the
factors of split layers are kept and the whole-run fit has no seconds per
iteration; its common factors are one per split class (``channel``,
``spatial``), each scaling that class's layer factors alike: the per-layer
times say how split layers compare with each other, the runs' unprofiled
steps how long they take (a split layer timed under the profiler carries the
profiler's cost on more, smaller calls, and its neighbours' waits: the 3-D
UNet's split layers read 3–4× their kernels' time there, and its ``h2`` plan
was predicted +46 % over its step, 2026-12-07).

:func:`held_out_predictions` refits without each run in turn and predicts it
(leave-one-out): the error after refining is measured only on runs the
correction never saw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from scipy.optimize import lsq_linear

from cost_models.corrections import POOLED, Corrections, layer_key, split_class
from cost_models.estimate import Estimate, LayerEstimate, estimate
from cost_models.formats.plan import Plan
from cost_models.profile import Profile

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["Observation", "fit_corrections", "held_out_predictions", "local_s", "observation"]

_FACTOR_BOUNDS = (1e-3, 1e3)  # wider than any machine's own profile needs: a preset on a CPU is ~300×
_MODEL_ERROR = 0.05  # relative error the model keeps however precise a measurement (weights of the whole-run fit)
_SHRINK = 0.2  # prior weight of a parent factor, in runs' predicted layer seconds (module docstring)
_STEP_S = 1e-3  # finite-difference step of the per-event seconds
_SCALE_STEP = 0.1  # … and of the common factor


@dataclass(frozen=True)
class Observation:
    """One measured run: its plan, median seconds per iteration and, optionally, seconds per layer."""

    name: str
    plan: Plan
    measured_s: float
    layers_s: Mapping[str, float] | None = None
    shared_cores: float | None = None  # the run's ranks shared this many cores (``cost_models.estimate``)
    noise: float = 0.0  # relative standard error of ``measured_s``

    def estimate(self, graph: LayerGraph, profile: Profile, optimizer: str) -> Estimate:
        """The full estimate of this run's plan under ``profile``, on the run's shared cores."""
        return estimate(graph, self.plan, profile, optimizer=optimizer, shared_cores=self.shared_cores)


def observation(name: str, plan: Plan, document: Mapping[str, Any], shared_cores: float | None) -> Observation:
    """An Observation from a ``parplan.measurement/1`` document of ``plan``'s run: its median step, its layers'
    forward plus backward seconds when it timed them, and the median's relative standard error
    (``1.253·σ/√n``, ``σ`` from the interquartile range of the steps)."""
    steps = sorted(document["per_step_s"])
    spread = steps[(3 * len(steps)) // 4] - steps[len(steps) // 4]
    noise = 1.253 * spread / 1.349 / len(steps) ** 0.5 / document["iteration_s"]
    rows = document.get("layers")
    layers = None if rows is None else {row["name"]: row["forward_s"] + row["backward_s"] for row in rows}
    return Observation(name, plan, document["iteration_s"], layers, shared_cores, noise)


def local_s(layer: LayerEstimate, plan: Plan | None = None, redistribution: bool = False) -> float:
    """A layer estimate's own seconds per measured batch of ``plan``: the part layer factors scale.

    A sync pipeline runs the layer on each of its micro-batches; a stale one runs its forward twice
    (once without autograd, once to recompute before backward). With ``redistribution``, the
    redistribution into the layer (which the profiler sees inside it) is added.
    """
    cost = layer.cost
    forward_times, backward_times = _passes(plan)
    shared = cost.halo_exposed_s / 2 + cost.norm_s / 2 + (layer.redistribution_s / 2 if redistribution else 0.0)
    return (forward_times * (cost.forward_s + shared)
            + backward_times * (cost.backward_s + cost.channel_reduce_s + shared))


def _passes(plan: Plan | None) -> tuple[int, int]:
    """How many forward and backward passes of a layer one measured batch of ``plan`` makes."""
    if plan is None or plan.pipeline.stages == 1:
        return 1, 1
    if plan.pipeline.schedule == "stale":
        return 2, 1
    return plan.pipeline.micro_batches, plan.pipeline.micro_batches


def fit_corrections(graph: LayerGraph, profile: Profile, runs: Sequence[Observation], optimizer: str = "sgd", *,
                    split_layers_only: bool = False) -> Corrections:
    """Corrections for ``profile`` (its own are ignored) that fit ``runs`` (module docstring).

    ``split_layers_only`` keeps the factors of split layers alone (keys ``kind·split`` and ``*·split``), fixes
    the seconds per iteration at 0 and scales each split class's factors by one common factor, so that the runs'
    whole steps are met (the per-layer times, taken under the profiler, carry its cost and the neighbours' waits
    twice over); the whole-run fit finds those, the per-event seconds and the exposed allreduce share
    (``parplan calibrate``'s split forms).
    """
    base = replace(profile, corrections=None)
    factors = _layer_factors(graph, base, runs, optimizer)
    if split_layers_only:
        factors = {key: value for key, value in factors.items() if "·" in key}
        groups = tuple(sorted({_scale_group(key) for key in factors}))
    else:
        groups = () if factors else ("",)  # measured layer factors already say how fast each layer runs
    free = _Free(any(run.plan.pipeline.stages > 1 for run in runs),
                 any(_hidden_allreduce_s(graph, base, run, optimizer) > 0 for run in runs), not split_layers_only,
                 groups)
    terms = _Terms((1.0,) * len(groups), 0.0, 0.0, 0.0)
    for _ in range(2):
        terms = _whole_run_terms(graph, base, runs, factors, terms, free, optimizer)
    layer_scale = {key: min(max(value, _FACTOR_BOUNDS[0]), _FACTOR_BOUNDS[1])
                   for key, value in _scaled(factors, groups, terms.scales).items()}
    scales = dict(zip(groups, terms.scales, strict=True))
    return Corrections(layer_scale, terms.step_s, terms.event_s, terms.exposed,
                       {"runs": [run.name for run in runs], "common_factor": scales.get("", 1.0),
                        "split_scales": {group: scale for group, scale in scales.items() if group},
                        "per_layer_runs": sum(run.layers_s is not None for run in runs)})


def _scale_group(key: str) -> str:
    """The split class a layer factor's key belongs to (``conv·spatial`` → ``spatial``); ``""`` for whole layers."""
    return key.split("·", 1)[1] if "·" in key else ""


def _scaled(factors: Mapping[str, float], groups: Sequence[str], scales: Sequence[float]) -> dict[str, float]:
    """``factors`` with each group's keys times its scale; without factors, the group ``""`` as every layer's."""
    scale_of = dict(zip(groups, scales, strict=True))
    if not factors:
        return {POOLED: scale_of[""]} if "" in scale_of else {}
    return {key: value * scale_of.get(_scale_group(key), 1.0) for key, value in factors.items()}


def held_out_predictions(graph: LayerGraph, profile: Profile, runs: Sequence[Observation],
                         optimizer: str = "sgd") -> list[float]:
    """For each run, its predicted seconds under corrections fitted to all the other runs."""
    predicted = []
    for index, run in enumerate(runs):
        others = [other for position, other in enumerate(runs) if position != index]
        corrections = fit_corrections(graph, profile, others, optimizer)
        predicted.append(run.estimate(graph, replace(profile, corrections=corrections), optimizer).iteration_s)
    return predicted


def _layer_factors(graph: LayerGraph, base: Profile, runs: Sequence[Observation], optimizer: str) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    parents: dict[str, str] = {}
    for run in runs:
        if run.layers_s is None:
            continue
        predicted_run = run.estimate(graph, base, optimizer)
        stretch = predicted_run.contention  # a layer's wall time stretches with the iteration on shared cores
        for layer in predicted_run.layers:
            predicted = stretch * local_s(layer, run.plan)
            if layer.name not in run.layers_s or predicted <= 0:
                continue
            moved = stretch * local_s(layer, run.plan, redistribution=True) - predicted
            measured = max(0.0, run.layers_s[layer.name] - moved)
            split = split_class(layer.layout)
            key, pooled = layer_key(layer.kind, layer.layout), f"{POOLED}·{split}" if split else POOLED
            parents[key], parents[pooled] = pooled, POOLED
            for name in {key, pooled, POOLED}:
                entry = sums.setdefault(name, [0.0, 0.0])
                entry[0] += measured
                entry[1] += predicted
    if POOLED not in sums or sums[POOLED][0] <= 0:
        return {}
    strength = _SHRINK * sums[POOLED][1] / sum(r.layers_s is not None for r in runs)
    factors = {POOLED: sums[POOLED][0] / sums[POOLED][1]}
    for name in sorted(sums, key=lambda key: (key.startswith(POOLED) is False, key)):  # parents first
        if name != POOLED:
            parent = factors[parents[name]]
            factors[name] = (sums[name][0] + strength * parent) / (sums[name][1] + strength)
    return factors


class _Terms(NamedTuple):
    scales: tuple[float, ...]
    step_s: float
    event_s: float
    exposed: float


class _Free(NamedTuple):
    """What the whole-run fit finds: the per-event seconds, the exposed allreduce share, the per-step seconds,
    and a common factor for each group of layer factors (``""``: every layer's when none was measured)."""

    events: bool
    allreduce: bool
    step: bool
    groups: tuple[str, ...]


def _hidden_allreduce_s(graph: LayerGraph, base: Profile, run: Observation, optimizer: str) -> float:
    stages = run.estimate(graph, base, optimizer).stages
    return sum(stage.allreduce_s - stage.allreduce_exposed_s for stage in stages)


def _whole_run_terms(graph: LayerGraph, base: Profile, runs: Sequence[Observation], factors: Mapping[str, float],
                     start: _Terms, free: _Free, optimizer: str) -> _Terms:
    """One Gauss–Newton step for the whole-run terms from ``start`` (``free``: which are fitted)."""

    def predict(run: Observation, terms: _Terms) -> float:
        corrections = Corrections(_scaled(factors, free.groups, terms.scales) or {POOLED: 1.0}, 0.0, terms.event_s,
                                  terms.exposed)
        return float(run.estimate(graph, replace(base, corrections=corrections), optimizer).iteration_s)

    rows, targets = [], []
    for run in runs:
        at = predict(run, start)
        row = [(predict(run, start._replace(scales=_bumped(start.scales, index))) - at) / _SCALE_STEP
               for index in range(len(free.groups))]
        row += [1.0] * free.step
        if free.events:
            row.append((predict(run, start._replace(event_s=start.event_s + _STEP_S)) - at) / _STEP_S)
        if free.allreduce:
            row.append(predict(run, start._replace(exposed=1.0)) - predict(run, start._replace(exposed=0.0)))
        weight = 1.0 / (run.measured_s * (run.noise ** 2 + _MODEL_ERROR ** 2) ** 0.5)
        rows.append([value * weight for value in row])
        targets.append((run.measured_s - at) * weight)
    # unknowns: Δscale of each group, the step (absolute: ``at`` has none), Δevent, Δexposed
    low = ([_FACTOR_BOUNDS[0] - scale for scale in start.scales] + [0.0] * free.step + [-start.event_s] * free.events
           + [-start.exposed] * free.allreduce)
    high = ([_FACTOR_BOUNDS[1] - scale for scale in start.scales] + [np.inf] * free.step + [np.inf] * free.events
            + [1.0 - start.exposed] * free.allreduce)
    if not rows[0]:
        return start
    solution = list(lsq_linear(np.array(rows), np.array(targets), bounds=(low, high)).x)
    scales = tuple(scale + solution.pop(0) for scale in start.scales)
    step_s = solution.pop(0) if free.step else 0.0
    event_s = start.event_s + solution.pop(0) if free.events else 0.0
    exposed = start.exposed + solution.pop(0) if free.allreduce else 0.0
    return _Terms(scales, step_s, event_s, exposed)


def _bumped(scales: tuple[float, ...], index: int) -> tuple[float, ...]:
    return tuple(scale + _SCALE_STEP * (position == index) for position, scale in enumerate(scales))
