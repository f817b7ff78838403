"""Pipeline stages and staleness: the outer search around the per-stage layout choice.

For each stage count ``K`` (2, 3, … up to ``max_stages``, dividing the
devices into equal stages of whole nodes — or of equal parts of one node)
and each allowed schedule:

* ``sync`` (GPipe): ``M`` micro-batches, ``M`` the divisor of the batch
  nearest below ``4K`` (GPipe's rule for a bubble under about 20%); every
  micro-batch's activations stay resident, which the memory rows include.
* ``stale`` (DSP): whole batches, staleness ``2(K−1−k)`` for stage ``k``,
  capped by ``max_staleness``; skipped when ``max_staleness`` is 0.

Cuts are contiguous in the decisions' topological order, chosen by dynamic
programming to minimise the largest stage's floor (the sum of its decisions'
cheapest options on the stage's devices) — a balance heuristic, not an exact
search over cuts. Inside each stage the layouts are solved exactly
(``planner.space``, ``planner.exact``) with both allreduce tables; every
resulting plan is priced by ``cost_models.estimate``, with the transfers
between stages, and the caller keeps the fastest that fits in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil
from typing import Any, Callable, Mapping, Sequence

from cost_models.cluster import Cluster
from cost_models.errors import InputError
from cost_models.estimate import Estimate, estimate
from cost_models.pipeline_cost import dsp_staleness
from cost_models.plan import LayerAssignment, Pipeline, Plan, SolverInfo
from cost_models.profile import Profile
from planner.cost_table import Solution
from planner.exact import solve_exact
from planner.explain import RunnerUp, runner_ups
from planner.edge_costs import PatternTable
from planner.space import LayerCosts, build_space, decision_groups

__all__ = ["PipelineCandidate", "balanced_cuts", "micro_batches", "search_pipelines", "stage_counts"]

PlanMaker = Callable[[Mapping[str, LayerAssignment], Pipeline, SolverInfo], Plan]


@dataclass(frozen=True)
class PipelineCandidate:
    """One pipeline plan the search priced, and whether it fits in memory."""

    plan: Plan
    estimate: Estimate
    fits: bool
    runner_ups: Mapping[str, RunnerUp]


def stage_counts(devices: int, devices_per_node: int, max_stages: int) -> list[int]:
    """Stage counts ``2..max_stages`` that split ``devices`` into equal stages of whole nodes (or of one node)."""
    counts = []
    for stages in range(2, max_stages + 1):
        per_stage, rest = divmod(devices, stages)
        if rest == 0 and (per_stage % devices_per_node == 0 or devices_per_node % per_stage == 0):
            counts.append(stages)
    return counts


def micro_batches(batch: int, stages: int) -> int:
    """The divisor of ``batch`` nearest below ``4·stages`` (at least 1)."""
    return max(m for m in range(1, min(batch, 4 * stages) + 1) if batch % m == 0)


def balanced_cuts(floors: Sequence[float], stages: int) -> list[int]:
    """Start index of each of ``stages`` contiguous segments of ``floors`` minimising the largest segment sum."""
    count = len(floors)
    if not 1 <= stages <= count:
        raise InputError(f"cannot cut {count} decisions into {stages} stages; use at most {count} stages")
    prefix = [0.0]
    for value in floors:
        prefix.append(prefix[-1] + value)
    best = {(0, 0): (0.0, -1)}  # (segments, end) -> (largest segment, previous end)
    for segments in range(1, stages + 1):
        for end in range(segments, count - (stages - segments) + 1):
            options = [(max(best[(segments - 1, start)][0], prefix[end] - prefix[start]), start)
                       for start in range(segments - 1, end) if (segments - 1, start) in best]
            best[(segments, end)] = min(options)
    starts, end = [], count
    for segments in range(stages, 0, -1):
        end = best[(segments, end)][1]
        starts.append(end)
    return starts[::-1]


def search_pipelines(graph: Any, profile: Profile, cluster: Cluster, make_plan: PlanMaker, max_stages: int,
                     schedule: str, max_staleness: int | None, optimizer: str = "sgd",
                     solver: str = "cbc", time_limit_s: float | None = None) -> list[PipelineCandidate]:
    """Every pipeline plan of the search (module docstring), priced; empty when no stage count applies."""
    found = []
    batch = graph.input_shape[0]
    for stages in stage_counts(cluster.devices, cluster.devices_per_node, max_stages):
        stage_cluster = _stage_cluster(cluster, stages)
        patterns = PatternTable(stage_cluster, stage_cluster.devices)  # shared by both schedules' searches
        schedules = []
        if schedule in ("sync", "auto"):
            schedules.append(("sync", micro_batches(batch, stages)))
        if schedule in ("stale", "auto") and max_staleness != 0:
            schedules.append(("stale", 1))
        for name, micro in schedules:
            staleness = dsp_staleness(stages, max_staleness) if name == "stale" else (0,) * stages
            pipeline = Pipeline(stages, (cluster.devices // stages,) * stages, name, micro, staleness)
            for assignments, info, explained in _stage_layouts(graph, profile, cluster, stages, micro, optimizer,
                                                               solver, time_limit_s, patterns):
                plan = make_plan(assignments, pipeline, info)
                predicted = estimate(graph, plan, profile, optimizer=optimizer)
                found.append(PipelineCandidate(plan, predicted, predicted.memory_bytes_max <= cluster.memory_bytes,
                                               explained))
    return found


def _stage_cluster(cluster: Cluster, stages: int) -> Cluster:
    devices = cluster.devices // stages
    return replace(cluster, devices=devices, devices_per_node=min(cluster.devices_per_node, devices))


def _stage_layouts(graph: Any, profile: Profile, cluster: Cluster, stages: int, micro: int, optimizer: str,
                   solver: str, time_limit_s: float | None, patterns: PatternTable
                   ) -> list[tuple[dict[str, LayerAssignment], SolverInfo, dict[str, RunnerUp]]]:
    """Per allreduce table (full, hidden): every layer's layout and stage, how the stages were solved, runner-ups.

    Empty when some stage fits nothing on its devices.
    """
    stage_cluster = _stage_cluster(cluster, stages)
    devices = stage_cluster.devices
    scaled = micro_batch_graph(graph, micro)
    costs = LayerCosts(scaled, profile, stage_cluster, devices, optimizer, saved_copies=micro, patterns=patterns)
    groups = decision_groups(scaled)
    heads = list(groups)
    if len(heads) < stages:
        return []
    floors = [min(row[1] for row in costs.rows(groups[head])) for head in heads]
    starts = balanced_cuts(floors, stages)
    results: list[dict[str, LayerAssignment]] = [{}, {}]
    solutions: list[list[Solution]] = [[], []]
    explained: list[dict[str, RunnerUp]] = [{}, {}]
    for stage, (start, stop) in enumerate(zip(starts, [*starts[1:], len(heads)])):
        space = build_space(scaled, profile, stage_cluster, devices, optimizer, cluster.memory_bytes,
                            decisions=heads[start:stop], costs=costs)
        for result, solved, why, table in zip(results, solutions, explained, (space.table, space.hidden_allreduce)):
            try:
                solution = solve_exact(table, solver, time_limit_s)
            except InputError:  # this stage fits nothing on its devices
                return []
            solved.append(solution)
            why.update(runner_ups(table, solution.choice))
            result.update({layer: LayerAssignment(layout, stage)
                           for layer, layout in space.layouts(solution.choice).items()})
    return [(result, _solver_info(solved), why) for result, solved, why in zip(results, solutions, explained)]


def _solver_info(solutions: list[Solution]) -> SolverInfo:
    """The stages' solves as one: solvers used, worst status, total seconds and objective, largest gap."""
    optimal = all(solution.status == "Optimal" for solution in solutions)
    gaps = [solution.gap for solution in solutions]
    return SolverInfo("+".join(dict.fromkeys(solution.solver for solution in solutions)),
                      "Optimal" if optimal else "TimeLimit", round(sum(s.seconds for s in solutions), 4),
                      sum(solution.objective_s for solution in solutions),
                      None if None in gaps else max(gaps))  # type: ignore[type-var]


def micro_batch_graph(graph: Any, micro: int) -> Any:
    """A copy of ``graph`` whose shapes carry ``⌈N/micro⌉`` samples (as ``estimate`` costs a micro-batch)."""
    if micro == 1:
        return graph
    scaled = graph.copy()

    def shrink(shape: list[Any]) -> list[Any]:
        return [ceil(shape[0] / micro), *shape[1:]] if shape and not isinstance(shape[0], list) else shape

    for _, data in scaled.nodes(data=True):
        data["output_shape"] = shrink(data["output_shape"])
        data["input_shapes"] = [shrink(shape) for shape in data.get("input_shapes", [])]
    return scaled
