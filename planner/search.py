"""Planning: the optimal per-layer layouts on D devices as one stage, pipelines around it, and the baselines.

``plan_model`` builds the one-stage search space (``planner.space``) and
solves it exactly (``planner.solvers.exact``) — once with each weight-gradient
allreduce counted in full and once with it fully hidden behind backward (the
two bounds of the overlap the additive objective cannot express). Both optima
are priced with the full cost model (``cost_models.estimate``). With
``max_stages > 1`` the pipeline search (``planner.pipeline.stages``) adds its plans.
The fastest plan that fits in memory is returned (of equally fast ones, the one
with the fewest stages, then the least memory: the same whatever order the
search found them in), beside two baselines
priced the same way: pure sample parallelism — what a user would run, on as
many devices as the batch has samples at most (``min(D, N)``, the largest
that divides the batch and makes whole nodes), the rest idle, not copies on
every device paying an allreduce over all of them — and the best single
layout used for every layer on all ``D`` devices. When a baseline is itself faster than both optima
(possible: the tables bracket the overlap, they do not model it), it is
returned as the plan, and the result says so.

The memory limit applies to what stays resident on a rank (weights,
gradients, optimizer state, saved activations); the transients of one layer
come on top and are reported in the prediction.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from cost_models.cluster import Cluster
from cost_models.errors import InputError, PlanError
from cost_models.estimate import CostMemo, Estimate, estimate
from cost_models.formats.plan import LayerAssignment, Pipeline, Plan, SolverInfo, recorded_shapes
from cost_models.layout import Layout
from cost_models.profile import Profile
from cost_models.uniform import layout_by_rule
from planner.ahead import rows_ahead
from planner.gc_pause import collector_paused
from planner.pipeline.stages import search_pipelines
from planner.settings import Progress, SearchSettings
from planner.solvers.exact import solve_exact
from planner.solvers.explain import RunnerUp, runner_ups
from planner.space import Arrivals, LayerCosts, Space, build_space

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["Baseline", "Considered", "PlanResult", "assigned_plan", "one_stage_plan", "plan_model", "priced",
           "sample_cluster"]


@dataclass(frozen=True)
class Baseline:
    """A plan a user might pick by hand, and what the cost model predicts for it."""

    name: str
    plan: Plan
    estimate: Estimate


@dataclass(frozen=True)
class Considered:
    """One plan the search priced: its one-line summary, predicted seconds, peak bytes and whether it fits."""

    summary: str
    iteration_s: float
    memory_bytes_max: int
    fits: bool


@dataclass(frozen=True)
class PlanResult:
    """The chosen plan, its estimate, the baselines, the search's size and what it considered."""

    plan: Plan
    estimate: Estimate
    baselines: tuple[Baseline, ...]
    candidates: int
    pruned: int
    considered: tuple[Considered, ...]
    runner_ups: Mapping[str, RunnerUp]
    search_s: float
    chosen_from: str  # "search", or the name of the baseline that the full estimate priced fastest
    skipped_configurations: int  # pipeline configurations whose lower bound could not beat the best plan


def plan_model(graph: LayerGraph, profile: Profile, cluster: Cluster, settings: SearchSettings, *,
               model_spec: str = "", progress: Progress | None = None) -> PlanResult:
    """The least predicted time plan for ``graph`` on ``cluster`` (see the module docstring).

    Args:
        settings: How to search: stages, schedule, staleness, solver, optimizer.
        model_spec: How to rebuild the model, recorded in the plan (``torchvision:resnet50``).
        progress: Told ``(done, total)`` as the stage search prices its configurations.

    Raises:
        InputError: No plan fits in memory (with how much is missing) or a layer cannot be placed.
    """
    started = time.perf_counter()
    with collector_paused():  # the search keeps what it allocates: collections would find next to nothing
        memo = _memo_for(graph, profile)  # layer costs shared by the spaces and every estimate
        ahead = rows_ahead(graph, profile, cluster, settings, memo)  # on another core, meanwhile
        try:
            return _plan_model(graph, profile, cluster, settings, model_spec, progress, memo,
                               None if ahead is None else ahead.arrivals, started)
        finally:
            if ahead is not None:
                ahead.close()


def _plan_model(graph: LayerGraph, profile: Profile, cluster: Cluster, settings: SearchSettings, model_spec: str,
                progress: Progress | None, memo: CostMemo, arrivals: Arrivals | None, started: float) -> PlanResult:
    optimizer = settings.optimizer
    costs = LayerCosts(graph, profile, cluster, cluster.devices, optimizer, memo=memo)
    costs.arrivals = arrivals
    space = build_space(graph, profile, cluster, cluster.devices, optimizer, cluster.memory_bytes, costs=costs)
    found: list[tuple[Plan, Estimate, Mapping[str, RunnerUp]]] = []
    failure = None
    for table in (space.table, space.hidden_allreduce):  # allreduce counted in full / fully hidden
        try:
            solution = solve_exact(table, settings.solver, settings.time_limit_s)
        except InputError as err:
            failure = err
            continue
        info = SolverInfo(solution.solver, solution.status, round(solution.seconds, 4), solution.objective_s,
                          solution.gap)
        plan = _plan(graph, cluster, _stage_zero(space.layouts(solution.choice)), Pipeline(1, (cluster.devices,)),
                     None, info, model_spec)
        predicted = estimate(graph, plan, profile, optimizer=optimizer, memo=memo)
        found.append((plan, predicted, runner_ups(table, solution.choice)))
    baselines = _baselines(graph, profile, cluster, space, optimizer, memo)
    skipped = 0
    if settings.max_stages > 1:
        def make(assignments: Mapping[str, LayerAssignment], pipeline: Pipeline, info: SolverInfo) -> Plan:
            return _plan(graph, cluster, assignments, pipeline, None, info, model_spec)
        priced = [predicted for _, predicted, _ in found] + [b.estimate for b in baselines]
        incumbent = min((p.iteration_s for p in priced if p.memory_bytes_max <= cluster.memory_bytes), default=None)
        searched = search_pipelines(graph, profile, cluster, make, settings, incumbent_s=incumbent, memo=memo,
                                    progress=progress, arrivals=arrivals)
        found += [(c.plan, c.estimate, c.runner_ups) for c in searched.candidates]
        skipped = searched.skipped
    return _choose(cluster, space, found, baselines, failure, skipped, time.perf_counter() - started)


_LAST: dict[str, CostMemo] = {}  # the fingerprint of the graph planned last, and its search's memo
_LAST_MOST = 200_000  # results kept from one search to the next at most


def _memo_for(graph: LayerGraph, profile: Profile) -> CostMemo:
    """The memo of a search of ``graph``: the last search's results when it planned the same traced graph with the
    same profile (another device count: its stages are this one's), else a new one. Values do not change."""
    dtype = graph.graph["dtype"]
    last = _LAST.get(graph.fingerprint)
    memo = (last.renewed() if last is not None and last.serves(profile, dtype) and last.size() < _LAST_MOST
            else CostMemo(profile, dtype))
    _LAST.clear()
    _LAST[graph.fingerprint] = memo
    return memo


def _choose(cluster: Cluster, space: Space, found: list[tuple[Plan, Estimate, Mapping[str, RunnerUp]]],
            baselines: tuple[Baseline, ...], failure: InputError | None, skipped: int,
            elapsed_s: float) -> PlanResult:
    pool = [(plan, predicted) for plan, predicted, _ in found] + [(b.plan, b.estimate) for b in baselines]
    fitting = [(predicted.iteration_s, plan.pipeline.stages, predicted.memory_bytes_max, index)
               for index, (plan, predicted) in enumerate(pool) if predicted.memory_bytes_max <= cluster.memory_bytes]
    if not fitting:
        raise failure or _nothing_fits(pool, cluster)
    index = min(fitting)[-1]  # the fastest; of equals, the fewest stages, then the least memory
    plan, predicted = pool[index]
    prediction = predicted.prediction()
    solved = next((p.solver for p, _, _ in found if p.solver is not None), None)
    chosen = replace(plan, predicted=prediction, solver=plan.solver or solved)
    chosen_from = "search" if index < len(found) else baselines[index - len(found)].name
    considered = tuple(Considered(p.summary(), e.iteration_s, e.memory_bytes_max,
                                  e.memory_bytes_max <= cluster.memory_bytes) for p, e, _ in found)
    candidates = sum(len(options) for options in space.candidates.values())
    return PlanResult(chosen, predicted, baselines, candidates, space.pruned, considered,
                      found[index][2] if index < len(found) else {}, elapsed_s, chosen_from, skipped)


def _nothing_fits(pool: list[tuple[Plan, Estimate]], cluster: Cluster) -> InputError:
    least = min(predicted.memory_bytes_max for _, predicted in pool)
    return InputError(f"no plan fits: the leanest plan found needs {least / 2**30:.2f} GiB per device, the devices "
                      f"have {cluster.memory_bytes / 2**30:.2f} GiB; use more devices, spatial or channel splits, or "
                      f"more pipeline stages (--max-stages)")


def _stage_zero(layouts: Mapping[str, Layout]) -> dict[str, LayerAssignment]:
    return {name: LayerAssignment(layout) for name, layout in layouts.items()}


def _plan(graph: LayerGraph, cluster: Cluster, assignments: Mapping[str, LayerAssignment], pipeline: Pipeline,
          predicted: Estimate | None, solver: SolverInfo | None, model_spec: str) -> Plan:
    prediction = None if predicted is None else predicted.prediction()
    return Plan(graph.fingerprint, tuple(graph.input_shape), graph.graph["dtype"], cluster,
                dict(assignments), pipeline, prediction, solver, model_spec,
                _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), recorded_shapes(graph.input_shapes))


def _baselines(graph: LayerGraph, profile: Profile, cluster: Cluster, space: Space, optimizer: str,
               memo: CostMemo) -> tuple[Baseline, ...]:
    """Pure sample parallelism (on at most as many devices as samples, the rest idle) and the best uniform layout."""
    found = []
    layers = graph.compute_layers()
    sample = sample_cluster(cluster, graph.input_shape[0])
    split = Layout(n=sample.devices)
    by_rule = layout_by_rule(graph, lambda name, position: (split, Layout()))
    try:  # only where the runtime splits every layer so (not a permutation moving the samples: coat's q, k, v)
        if all(by_rule[name] == split for name in layers):
            found.append(_baseline("pure sample", graph, profile, sample, by_rule, optimizer, memo))
    except (PlanError, InputError):  # a layer smaller than the batch split (a reshape folding the batch), or a
        pass  # value whose dimension 0 holds no samples too short for the split
    if space.uniform_s:
        best = min(space.uniform_s, key=lambda layout: (space.uniform_s[layout], layout.parts()))
        per_decision = space.uniform_layouts[best]
        others = sorted({str(layout) for layout in per_decision.values() if layout != best})
        name = f"best single layout ({best}" + (f"; {', '.join(others)} where it does not apply)" if others else ")")
        layouts = {layer: per_decision[head] for head, members in space.members.items() for layer in members}
        found.append(_baseline(name, graph, profile, cluster, layouts, optimizer, memo))
    return tuple(found)


def sample_cluster(cluster: Cluster, batch: int) -> Cluster:
    """The devices pure sample parallelism uses of ``cluster``: the most, at most ``batch``, that divide the batch
    and fill whole nodes (or part of one); the rest stay idle."""
    for devices in range(min(cluster.devices, batch), 0, -1):
        if batch % devices == 0 and (devices <= cluster.devices_per_node or devices % cluster.devices_per_node == 0):
            return replace(cluster, devices=devices, devices_per_node=min(cluster.devices_per_node, devices))
    return replace(cluster, devices=1, devices_per_node=1)


def _baseline(name: str, graph: LayerGraph, profile: Profile, cluster: Cluster, layouts: Mapping[str, Layout],
              optimizer: str, memo: CostMemo) -> Baseline:
    return priced(name, one_stage_plan(graph, cluster, layouts), profile, graph, optimizer, memo=memo)


def assigned_plan(graph: LayerGraph, cluster: Cluster, assignments: Mapping[str, LayerAssignment], pipeline: Pipeline,
                  solver: SolverInfo | None, model_spec: str = "") -> Plan:
    """A plan of the given per-layer assignments and pipeline, without a prediction."""
    return _plan(graph, cluster, assignments, pipeline, None, solver, model_spec)


def one_stage_plan(graph: LayerGraph, cluster: Cluster, layouts: Mapping[str, Layout], model_spec: str = "",
                   solver: SolverInfo | None = None) -> Plan:
    """The plan placing each layer in its layout of ``layouts`` on all of ``cluster``'s devices, one stage."""
    return _plan(graph, cluster, _stage_zero(layouts), Pipeline(1, (cluster.devices,)), None, solver, model_spec)


def priced(name: str, plan: Plan, profile: Profile, graph: LayerGraph, optimizer: str = "sgd",
           shared_cores: float | None = None, *, memo: CostMemo | None = None) -> Baseline:
    """``plan`` under ``name`` with its full estimate (and the prediction recorded in the plan).

    ``shared_cores``: the ranks share one host's cores (``cost_models.estimate``). ``memo``: layer costs
    already computed (``cost_models.estimate.CostMemo``).
    """
    predicted = estimate(graph, plan, profile, optimizer=optimizer, shared_cores=shared_cores, memo=memo)
    prediction = predicted.prediction()
    return Baseline(name, replace(plan, predicted=prediction), predicted)
