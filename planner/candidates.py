"""The plans ``parplan validate`` runs: the planner's top K distinct plans, then the baselines.

* **Top K**: the planner's choice (``plan_model``, pipelines included), then
  the fastest plans of a pool, by the full estimate, that fit in memory, that
  the runtime can run, and whose predicted times are at least ``min_gap``
  (3%) apart from every plan already chosen — plans closer than the noise of
  a measurement cannot be ranked by measuring them. The pool: the 2K best
  one-stage plans of the exact search (the cost table solved again with every
  earlier optimum excluded, no-good cuts in ``planner.solvers.ilp``, each differing
  from all earlier ones in at least ``min_difference`` decisions, default a
  tenth of them), every single layout over all devices, and the baselines.
* **Baselines**: pure sample parallelism, pure spatial parallelism (the best
  single layout that splits only height and width over all devices), and a
  pipeline (the stage search's best) — each added unless already in the top K.

Every candidate carries its full estimate, so the validation compares the
measured time with exactly what ``parplan plan`` would have predicted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from cost_models.cluster import Cluster
from cost_models.errors import InputError
from cost_models.estimate import Estimate
from cost_models.formats.plan import LayerAssignment, Pipeline, Plan, SolverInfo
from cost_models.profile import Profile
from planner.pipeline.stages import search_pipelines
from planner.search import Baseline, assigned_plan, one_stage_plan, plan_model, priced
from planner.settings import SearchSettings
from planner.solvers.ilp import solve_ilp
from planner.space import Space, build_space

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["Candidate", "Refusal", "validation_candidates"]

Refusal = Callable[[Plan], "str | None"]
Price = Callable[[str, Plan], Baseline]


@dataclass(frozen=True)
class Candidate:
    """A plan to run: its name (``top 1`` is the planner's choice), role (``top``/``baseline``) and estimate."""

    name: str
    role: str
    plan: Plan
    estimate: Estimate


def validation_candidates(graph: LayerGraph, profile: Profile, cluster: Cluster, k: int, settings: SearchSettings, *,
                          model_spec: str = "", min_difference: int | None = None, min_gap: float = 0.03,
                          refusal: Refusal | None = None,
                          shared_cores: float | None = None) -> tuple[list[Candidate], list[str]]:
    """Top ``k`` distinct plans, then the baselines not among them (module docstring), and what was left out.

    Args:
        settings: The search's options, as ``parplan plan`` takes them (the planner's choice is made with them).
        min_gap: Relative distance of predicted times between any two top plans (plans closer than the
            measurement noise cannot be ranked by measuring them).
        refusal: Why the runtime cannot run a plan (``None`` when it can); refused plans are left out
            and named in the second list.
        shared_cores: The ranks share one host's cores (``cost_models.estimate``), in the candidates'
            predictions (not in the planner's choice, which is what ``parplan plan`` would make).

    Raises:
        InputError: No plan fits in memory.
    """
    chosen = plan_model(graph, profile, cluster, settings, model_spec=model_spec)
    optimizer = settings.optimizer
    space = build_space(graph, profile, cluster, cluster.devices, optimizer, cluster.memory_bytes)
    difference = min_difference or max(1, round(len(space.table.layers) / 10))
    price = partial(_price, profile=profile, graph=graph, optimizer=optimizer, shared_cores=shared_cores)
    pipelines = _pipelines(graph, profile, cluster, settings, model_spec, price)
    baselines = _baselines(graph, cluster, space, chosen.baselines, pipelines[:1], price)
    pool = _k_best(graph, cluster, space, 2 * k, difference, model_spec, settings.solver, price)
    pool += _uniform(graph, cluster, space, price) + pipelines + baselines
    left_out: list[str] = []
    runnable = [b for b in pool if _runs(b, refusal, left_out)]
    first = price("top 1", chosen.plan)
    if not _runs(first, refusal, left_out):  # the next plan stands in for it; left_out says why
        if not runnable:
            raise InputError(f"the runtime can run none of the plans for {cluster.devices} devices: {left_out[0]}")
        first, runnable = runnable[0], runnable[1:]
    top = _distinct_fastest(first, runnable, cluster, k, min_gap)
    found = [Candidate(f"top {rank}", "top", b.plan, b.estimate) for rank, b in enumerate(top, start=1)]
    for baseline in baselines:
        twin = next((c for c in found if _key(c.plan) == _key(baseline.plan)), None)
        if twin is None and _runs(baseline, refusal, []):
            found.append(Candidate(baseline.name, "baseline", baseline.plan, baseline.estimate))
        elif twin is not None:
            found[found.index(twin)] = Candidate(f"{twin.name} = {baseline.name}", "top", twin.plan, twin.estimate)
    return found, sorted(set(left_out))


def _runs(entry: Baseline, refusal: Refusal | None, left_out: list[str]) -> bool:
    reason = refusal(entry.plan) if refusal is not None else None
    if reason is not None:
        left_out.append(f"{entry.plan.summary()}: {reason}")
    return reason is None


def _price(name: str, plan: Plan, profile: Profile, graph: LayerGraph, optimizer: str,
           shared_cores: float | None) -> Baseline:
    return priced(name, plan, profile, graph, optimizer, shared_cores)


def _k_best(graph: LayerGraph, cluster: Cluster, space: Space, count: int, difference: int, model_spec: str,
            solver: str, price: Price) -> list[Baseline]:
    """The ``count`` best one-stage plans of the full-allreduce table, each ``difference`` decisions from the
    others."""
    found: list[Baseline] = []
    excluded: list[Mapping[str, int]] = []
    for _ in range(count):
        try:
            solution = solve_ilp(space.table, solver, exclude=excluded, min_difference=difference)
        except ValueError:  # no further plan fits
            break
        excluded.append(solution.choice)
        info = SolverInfo(solution.solver, solution.status, round(solution.seconds, 4), solution.objective_s,
                          solution.gap)
        plan = one_stage_plan(graph, cluster, space.layouts(solution.choice), model_spec, info)
        found.append(price(f"exact search, {len(excluded)}. best", plan))
    return found


def _pipelines(graph: LayerGraph, profile: Profile, cluster: Cluster, settings: SearchSettings, model_spec: str,
               price: Price) -> list[Baseline]:
    """Every pipeline plan of the stage search that fits, fastest first."""
    if settings.max_stages < 2 or cluster.devices < 2:
        return []

    def make(assignments: Mapping[str, LayerAssignment], pipeline: Pipeline, info: SolverInfo) -> Plan:
        return assigned_plan(graph, cluster, assignments, pipeline, info, model_spec)

    searched = search_pipelines(graph, profile, cluster, make, settings, prune=False)
    fitting = sorted((c for c in searched.candidates if c.fits), key=lambda c: c.estimate.iteration_s)
    priced_plans = [price(f"pipeline ({c.plan.pipeline.stages} stages, {c.plan.pipeline.schedule})", c.plan)
                    for c in fitting]
    return sorted(priced_plans, key=lambda b: b.estimate.iteration_s)


def _distinct_fastest(first: Baseline, pool: list[Baseline], cluster: Cluster, k: int,
                      min_gap: float) -> list[Baseline]:
    """``first`` (the planner's choice), then the fastest plans that fit, each ``min_gap`` from all chosen, ``k`` in
    all.

    The planner's choice stays first even when the pool holds a plan its search did not price that is
    predicted faster: the validation measures what ``parplan plan`` would have run.
    """
    chosen = [first]
    for entry in sorted(pool, key=lambda b: b.estimate.iteration_s):
        if len(chosen) == k:
            break
        time_s = entry.estimate.iteration_s
        if entry.estimate.memory_bytes_max > cluster.memory_bytes or any(
                _key(entry.plan) == _key(c.plan) or abs(time_s - c.estimate.iteration_s) < min_gap * min(
                    time_s, c.estimate.iteration_s) for c in chosen):
            continue
        chosen.append(entry)
    return [first, *sorted(chosen[1:], key=lambda b: b.estimate.iteration_s)]


def _uniform(graph: LayerGraph, cluster: Cluster, space: Space, price: Price) -> list[Baseline]:
    """One plan per single layout over all devices (layers it cannot split take the space's fallback)."""
    found = []
    for layout, per_decision in space.uniform_layouts.items():
        layouts = {layer: per_decision[head] for head, members in space.members.items() for layer in members}
        found.append(price(f"single layout {layout}", one_stage_plan(graph, cluster, layouts)))
    return found


def _baselines(graph: LayerGraph, cluster: Cluster, space: Space, planned: tuple[Baseline, ...],
               pipeline: list[Baseline], price: Price) -> list[Baseline]:
    found = [price(b.name, b.plan) for b in planned if b.name == "pure sample"]
    spatial = [layout for layout in space.uniform_s if layout.n == layout.c == 1 and layout.ranks == cluster.devices]
    if spatial:
        layout = min(spatial, key=lambda candidate: (space.uniform_s[candidate], candidate.parts()))
        per_decision = space.uniform_layouts[layout]
        layouts = {layer: per_decision[head] for head, members in space.members.items() for layer in members}
        found.append(price(f"pure spatial ({layout})", one_stage_plan(graph, cluster, layouts)))
    return found + pipeline


_PlanKey = tuple[tuple[tuple[str, str, int], ...], str, int, int, tuple[int, ...]]


def _key(plan: Plan) -> _PlanKey:
    """What makes two plans the same plan: every layer's layout and stage, and the pipeline."""
    layers = tuple(sorted((name, str(a.layout), a.stage) for name, a in plan.layers.items()))
    p = plan.pipeline
    return layers, p.schedule, p.stages, p.micro_batches, tuple(p.staleness)
