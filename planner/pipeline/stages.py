"""Pipeline stages and staleness: the outer search around the per-stage layout choice.

For each device budget ``B`` (``D``, ``D/2``, ``D/4`` … down to 2 devices, the
rest idle: ``planner.pipeline.sizes.budgets`` — past some size a small batch runs
faster on fewer devices), each stage count ``K`` (2, 3, … up to
``max_stages``) and each allowed schedule — each stage on one of the two device
counts nearest ``B/K`` from below and above among those of equal stages of whole
nodes (or of equal parts of one node) and any other number of whole nodes the
model's largest activation splits over exactly (``planner.pipeline.sizes.stage_sizes``: 64
devices in 3 stages for a batch of 12: 24 + 24 + 16), the cuts choosing which,
within the ``B`` devices (1024 in 7 stages: 256 + 6 × 128; devices may stay
idle), each stage whole nodes from a node's first device or inside one node:

* ``sync`` (GPipe, run in 1F1B order): ``M`` micro-batches, each count of
  :func:`micro_batch_counts` a configuration of its own (more micro-batches: a smaller bubble
  and less memory, smaller kernels; the bound below prunes most); stage ``k`` holds ``min(M, K − k)``
  micro-batches' activations at once, which its memory rows count. Where that binds — the stage's optimum under the
  memory limit is not its unconstrained one — the stage is also solved
  recomputing: it keeps only its inputs and one micro-batch's activations, and
  every layer's time adds its forward (``Pipeline.recompute``); the cheaper
  solve wins, so a stage recomputes only where memory makes it pay.
* ``stale`` (DSP): whole batches; every stage recomputes its forward before
  its backward, so its time per batch is ``2F + B``, which its layouts are
  solved for. The stages are solved with DSP's staleness
  ``2(K−1−k)`` for stage ``k`` (capped by ``max_staleness``) — its stashes the
  most memory any choice below could need — then each stage's staleness is
  lowered to the least that keeps the pipeline at its busiest server's pace
  under the stages' predicted times (``cost_models.pipeline_cost.least_staleness``),
  never above that cap; skipped when ``max_staleness`` is 0.

Cuts are contiguous in the decisions' topological order and in the model's
traced order (what the runtime cuts), never between a layer's tuple of
tensors and its readers (``cost_models.capability.predicate.crosses_as_tuple``), and
exact: ``planner.pipeline.cuts`` minimises ``Σ_k t_k + (M − 1)·max_k t_k``
(``sync``) or ``max_k t_k`` (``stale``) over every allowed cut and every split
of the devices among those sizes, each stage's
time ``t_k`` its layouts' exact optimum on its devices (``planner.space``,
``planner.solvers.exact``; memory and recomputation included), asked for lazily
after lower bounds — the sum of each decision's cheapest option (on
ResNet-50 at 1024 devices two to five rounds of the DP suffice). Each allreduce table (in full, hidden) gets its
own cuts; every resulting plan is priced by ``cost_models.estimate``, with
the transfers between stages, and the caller keeps the fastest that fits in
memory. A
configuration whose lower bound cannot beat the fastest plan found so far is
skipped (:func:`search_pipelines`), and so is one in which some layer has no
layout at all (a batch-norm over a one-sample micro-batch of ``1×1`` maps), and
a stale one whose cuts cannot beat it once each stage's pace counts its
transfer to the next (:func:`_sends_rule_out`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from math import inf
from typing import TYPE_CHECKING

from cost_models.cluster import Cluster, stage_cluster
from cost_models.errors import InputError
from cost_models.estimate import CostMemo, Estimate, estimate, restaled
from cost_models.formats.plan import LayerAssignment, Pipeline, Plan, Schedule, SolverInfo
from cost_models.ir.micro_batches import micro_batch_graph
from cost_models.pipeline_cost import dsp_staleness, least_staleness
from cost_models.profile import Profile
from planner.edge_costs import PatternTable, has_volumes
from planner.pipeline.bounds import Floor, decision_works_s, heaviest_first, send_floor
from planner.pipeline.cuts import allowed_cuts, exact_cuts
from planner.pipeline.sizes import budgets, micro_batch_counts, sizes_for, stage_counts, stage_sizes
from planner.settings import Progress, SearchSettings
from planner.solvers.cost_table import CostTable, Solution
from planner.solvers.exact import UNCONSTRAINED_SOLVERS, solve_exact
from planner.solvers.explain import RunnerUp, runner_ups
from planner.space import Arrivals, LayerCosts, Space, build_space, decision_groups

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["PipelineCandidate", "PipelineSearch", "micro_batch_counts", "search_pipelines", "stage_counts"]

PlanMaker = Callable[[Mapping[str, LayerAssignment], Pipeline, SolverInfo], Plan]


@dataclass(frozen=True)
class PipelineCandidate:
    """One pipeline plan the search priced, and whether it fits in memory."""

    plan: Plan
    estimate: Estimate
    fits: bool
    runner_ups: Mapping[str, RunnerUp]


@dataclass(frozen=True)
class PipelineSearch:
    """The pipeline plans priced, and how many configurations the bound skipped unsolved."""

    candidates: tuple[PipelineCandidate, ...]
    skipped: int


@dataclass(frozen=True)
class _Config:
    """One stage count and schedule, with its per-stage cost cache and a lazy lower bound on its iteration time."""

    pipeline: Pipeline  # its devices per stage: the least size each (the cuts choose)
    graph: LayerGraph
    groups: Mapping[str, tuple[str, ...]]
    sizes: tuple[int, ...]
    """The device counts a stage may take (``planner.pipeline.sizes.stage_sizes``)."""
    budget: int
    """The devices its stages may use together, at most (the rest idle: ``planner.pipeline.sizes.budgets``)."""
    floor: Floor
    stage_costs: Callable[[int, bool, int], LayerCosts | None]
    """Stage ``k``'s costs on ``size`` devices keeping (``False``) or recomputing (``True``; ``None`` for a stale
    schedule, which always recomputes) its activations: the memory of as many micro-batches as its schedule
    holds at once."""


_SUMMED_AT_ONCE = 1  # decisions a configuration's bound sums each time it is first in line


def search_pipelines(graph: LayerGraph, profile: Profile, cluster: Cluster, make_plan: PlanMaker,
                     settings: SearchSettings, *, incumbent_s: float | None = None, prune: bool = True,
                     memo: CostMemo | None = None, progress: Progress | None = None,
                     arrivals: Arrivals | None = None) -> PipelineSearch:
    """The pipeline plans of the search (module docstring), priced.

    Best first: the configuration of the least lower bound on its iteration time
    (``planner.pipeline.bounds.Floor``) is taken next; where its bound is not yet
    summed over every decision it sums one more (the decisions writing the
    most elements first; those not summed yet count their least device-seconds)
    and goes back in line, else it is solved: a configuration is priced no
    further than its turn in line needs. The search
    ends when the least bound reaches the fastest plan that fits found so far
    (``incumbent_s`` to start with): every configuration left is skipped. Every
    stage's forward and backward take at least the sum of its decisions'
    cheapest options without the allreduce, so a ``stale`` pipeline needs at least that
    sum over all decisions divided by ``K``, and a ``sync`` one ``(K + M − 1)/K`` times it (per
    micro-batch: ``Σ_k t_k + (M − 1)·max_k t_k`` with ``max_k t_k ≥ Σ_k t_k / K``); and every configuration
    at least its layers' least device-seconds over its device budget, known unpriced — one that cannot win
    costs the layouts of a few decisions, or none. ``prune=False`` prices every configuration (to check that
    rule). ``memo``: layer costs shared with the caller's other estimates (``cost_models.estimate.CostMemo``).
    ``progress(done, total)`` is called as configurations are solved or skipped. ``arrivals``: every stage's
    ``LayerCosts.arrivals`` (rows computed elsewhere: ``planner.ahead``).
    """
    memo = memo or CostMemo(profile, graph.graph["dtype"])
    made = _Makers(graph, profile, cluster, settings.optimizer, memo)
    made.arrivals = arrivals
    configs = _configs(graph, profile, cluster, settings, memo, made)
    line = [(config.floor.bound_s, index) for index, config in enumerate(configs)]
    heapq.heapify(line)
    found: list[PipelineCandidate] = []
    skipped, best, done = 0, incumbent_s, 0
    solved = _Shared()  # stage solves, shared by the configurations
    while line:
        if progress is not None:
            progress(done, len(configs))
        _, index = heapq.heappop(line)
        floor, limit_s = configs[index].floor, best if prune else None
        if floor.reaches(limit_s, _SUMMED_AT_ONCE if prune else None) or not floor.valid:
            skipped, done = skipped + floor.valid, done + 1
            continue
        if floor.summed < len(floor.order):  # not summed over every decision yet: back in line
            heapq.heappush(line, (floor.bound_s, index))
            continue
        done += 1
        for candidate in _priced_layouts(configs[index], graph, profile, cluster, make_plan, settings, limit_s, solved,
                                         memo):
            found.append(candidate)
            if candidate.fits and (best is None or candidate.estimate.iteration_s < best):
                best = candidate.estimate.iteration_s
    if progress is not None:
        progress(len(configs), len(configs))
    return PipelineSearch(tuple(found), skipped)


def _priced_layouts(config: _Config, graph: LayerGraph, profile: Profile, cluster: Cluster, make_plan: PlanMaker,
                    settings: SearchSettings, limit_s: float | None, solved: _Shared,
                    memo: CostMemo) -> list[PipelineCandidate]:
    """The configuration's plans (one per allreduce table whose cuts can beat ``limit_s``), priced in full."""
    found = []
    for assignments, info, explained, pipeline in _stage_layouts(config, profile, cluster, settings, limit_s, solved):
        plan = make_plan(assignments, pipeline, info)
        predicted = estimate(graph, plan, profile, optimizer=settings.optimizer, memo=memo)
        if plan.pipeline.schedule == "stale":
            capped, plan = plan, _least_stale(plan, predicted)
            predicted = restaled(graph, plan, predicted, capped.pipeline.staleness, profile, memo=memo)
        found.append(PipelineCandidate(plan, predicted, predicted.memory_bytes_max <= cluster.memory_bytes, explained))
    return found


def _least_stale(plan: Plan, predicted: Estimate) -> Plan:
    """``plan`` (stale, solved with its staleness as the cap) with each stage's staleness the least that keeps the
    predicted pace (module docstring)."""
    stages = predicted.stages
    least = least_staleness([s.forward_s for s in stages], [s.backward_s for s in stages],
                            [s.transfer_s for s in stages[:-1]], [s.allreduce_s for s in stages])
    lags = tuple(min(lag, cap) for lag, cap in zip(least, plan.pipeline.staleness))
    return replace(plan, pipeline=replace(plan.pipeline, staleness=lags))


def _configs(graph: LayerGraph, profile: Profile, cluster: Cluster, settings: SearchSettings, memo: CostMemo,
             made: _Makers | None = None) -> list[_Config]:
    """Every stage count, device budget and schedule (each micro-batch count a configuration), with lazy bounds."""
    configs = []
    made = made or _Makers(graph, profile, cluster, settings.optimizer, memo)
    everything = stage_sizes(cluster, graph)
    for budget in budgets(cluster.devices, cluster.devices_per_node):
        for stages in range(2, settings.max_stages + 1):
            sizes = sizes_for(stages, budget, everything)
            for name, micro in _schedules(graph.input_shape[0], stages, settings) if sizes else ():
                config = _config(made, name, micro, stages, sizes, budget, settings)
                if config is not None:
                    configs.append(config)
    return configs


def _config(made: _Makers, name: Schedule, micro: int, stages: int, sizes: tuple[int, ...], budget: int,
            settings: SearchSettings) -> _Config | None:
    """One configuration with its lazy bound; ``None`` where the model has fewer decisions than stages."""
    groups, order = made.decisions(micro)
    if len(groups) < stages:
        return None
    stage_costs = _stage_costs(made, name, micro, stages)

    def seconds(size: int) -> LayerCosts:
        """A stage's costs for the bound, which reads their seconds only: one kept micro-batch's (or, stale,
        recomputed), shared by every stage count."""
        return made(size, micro)(1, name == "stale")
    staleness = dsp_staleness(stages, settings.max_staleness) if name == "stale" else (0,) * stages
    return _Config(Pipeline(stages, (sizes[0],) * stages, name, micro, staleness), made.graph(micro), groups, sizes,
                   budget, Floor(sizes, seconds, order, schedule=name, stages=stages, micro_batches=micro,
                                 devices=budget, works_s=made.works_s(micro, name == "stale")), stage_costs)


class _Makers:
    """Layer costs per stage size and micro-batch count, made once and shared by every configuration (a stage of
    256 devices is the same in a 4-stage and a 3-stage pipeline), with the micro-batch graphs and move patterns."""

    def __init__(self, graph: LayerGraph, profile: Profile, cluster: Cluster, optimizer: str, memo: CostMemo) -> None:
        self.source, self.profile, self.cluster, self.optimizer, self.memo = graph, profile, cluster, optimizer, memo
        self.graphs: dict[int, LayerGraph] = {}
        self.patterns: dict[int, PatternTable] = {}
        self.makers: dict[tuple[int, int], Callable[[int, bool], LayerCosts]] = {}
        self.works: dict[tuple[int, bool], list[float]] = {}
        self.groups: dict[int, tuple[dict[str, tuple[str, ...]], list[str]]] = {}
        self.arrivals: Arrivals | None = None  # given to every LayerCosts made

    def graph(self, micro: int) -> LayerGraph:
        """The graph of one of ``micro`` micro-batches."""
        if micro not in self.graphs:
            self.graphs[micro] = micro_batch_graph(self.source, micro)
        return self.graphs[micro]

    def decisions(self, micro: int) -> tuple[dict[str, tuple[str, ...]], list[str]]:
        """The decisions of one of ``micro`` micro-batches' graph, and their order heaviest first."""
        if micro not in self.groups:
            groups = decision_groups(self.graph(micro))
            self.groups[micro] = (groups, heaviest_first(self.graph(micro), groups))
        return self.groups[micro]

    def works_s(self, micro: int, recompute: bool) -> list[float]:
        """The least device-seconds of each decision of one of ``micro`` micro-batches, heaviest first
        (``planner.pipeline.bounds``)."""
        if (micro, recompute) not in self.works:
            groups, order = self.decisions(micro)
            self.works[micro, recompute] = decision_works_s(self.graph(micro), self.profile, groups, order,
                                                            recompute=recompute)
        return self.works[micro, recompute]

    def __call__(self, size: int, micro: int) -> Callable[[int, bool], LayerCosts]:
        """``(saved copies, recompute) → LayerCosts`` of a stage of ``size`` devices and ``micro`` micro-batches."""
        if (size, micro) not in self.makers:
            sized = stage_cluster(self.cluster, size)
            if size not in self.patterns:  # both schedules, every micro-batch size
                self.patterns[size] = PatternTable(sized, size, depth=has_volumes(self.source))
            batch = int(self.source.input_shape[0])
            smallest = None if batch % micro == 0 else micro_batch_graph(self.source, micro, smallest=True)
            self.makers[size, micro] = _costs_maker(self.graph(micro), self.profile, sized, self.optimizer,
                                                    self.patterns[size], self.memo, smallest, self.decisions(micro)[0],
                                                    self.arrivals)
        return self.makers[size, micro]


def _schedules(batch: int, stages: int, settings: SearchSettings) -> list[tuple[Schedule, int]]:
    """The schedules and micro-batch counts of one stage count: ``sync`` with each count, then ``stale``."""
    schedules: list[tuple[Schedule, int]] = []
    if settings.schedule in ("sync", "auto"):
        schedules += [("sync", count) for count in micro_batch_counts(batch, stages)]
    if settings.schedule in ("stale", "auto") and settings.max_staleness != 0:
        schedules.append(("stale", 1))
    return schedules


def _costs_maker(graph: LayerGraph, profile: Profile, cluster: Cluster, optimizer: str, patterns: PatternTable,
                 memo: CostMemo, smallest: LayerGraph | None, groups: Mapping[str, tuple[str, ...]],
                 arrivals: Arrivals | None = None) -> Callable[[int, bool], LayerCosts]:
    """``(saved copies, recompute) → LayerCosts`` of ``graph`` (its decisions ``groups``) on the stage's devices,
    each made once; ``smallest``: the graph on the smallest micro-batch, where they differ (``LayerCosts``)."""
    made: dict[tuple[int, bool], LayerCosts] = {}

    def costs(copies: int, recompute: bool) -> LayerCosts:
        key = (1 if recompute else copies, recompute)
        if key not in made:
            made[key] = (next(iter(made.values())).variant(*key) if made else
                         LayerCosts(graph, profile, cluster, cluster.devices, optimizer, saved_copies=key[0],
                                    patterns=patterns, memo=memo, recompute=recompute, smallest=smallest,
                                    groups=groups))
            made[key].arrivals = arrivals
        return made[key]
    return costs


def _stage_costs(made: _Makers, schedule: str, micro: int,
                 stages: int) -> Callable[[int, bool, int], LayerCosts | None]:
    """Stage ``k``'s costs on ``size`` devices: under 1F1B it holds ``min(M, K − k)`` micro-batches' activations at
    once (or, recomputing, one); a stale stage always recomputes (its time per batch is ``2F + B``: DSP's pace),
    holding one batch's activations (its stashed inputs are the estimate's to count), and has no other way to
    choose."""
    def costs(stage: int, recompute: bool, size: int) -> LayerCosts | None:
        if schedule == "stale":
            return None if recompute else made(size, micro)(1, True)
        return made(size, micro)(min(micro, stages - stage), recompute)
    return costs


_Solve = tuple[Space, CostTable, Solution, bool]
_Segment = tuple[int, int, int, int]  # decisions i … j−1 as stage k on size devices


class _Shared:
    """What the configurations of one search share: each segment's stage spaces (keyed by the identity of its cost
    variants and its decisions), their optimum per allreduce table, and the transfer floors
    (``planner.pipeline.bounds.send_floor``)."""

    def __init__(self) -> None:
        self.spaces: dict[tuple[int, int, int, int], _StageSpaces] = {}
        self.solves: dict[tuple[tuple[int, int, int, int], int], _Solve | None] = {}
        self.sends: dict[tuple[int, int], list[float]] = {}


def _stage_layouts(config: _Config, profile: Profile, cluster: Cluster, settings: SearchSettings,
                   limit_s: float | None = None, solved: _Shared | None = None
                   ) -> list[tuple[dict[str, LayerAssignment], SolverInfo, dict[str, RunnerUp], Pipeline]]:
    """Per allreduce table (full, hidden): the exact cuts and stage sizes (``planner.pipeline.cuts``) and every
    layer's layout and stage, how the stages were solved, runner-ups and the pipeline (each stage's devices,
    which stages recompute).

    The hidden table goes first: its optimum is the least of both, so where its cuts cannot come under
    ``limit_s`` (the best plan found so far) — or no cut gives every stage a layout that fits — neither table
    is solved further and the list is empty. ``solved``: stage solves shared with other configurations (a
    segment of the same costs is the same problem).
    """
    heads, allowed = list(config.groups), allowed_cuts(config.graph, config.groups)
    shared = _Shared() if solved is None else solved
    if limit_s is not None and _sends_rule_out(config, heads, allowed, profile, cluster, shared, limit_s):
        return []
    found = {}
    for which in (1, 0):
        bounds = {size: _floor_bound(config, heads, which, cluster.memory_bytes, size) for size in config.sizes}
        solves: dict[_Segment, _Solve | None] = {}

        def true(i: int, j: int, k: int, size: int, which: int = which,
                 solves: dict[_Segment, _Solve | None] = solves) -> float:
            solve = solves[i, j, k, size] = _segment_solve(config, profile, cluster, settings, shared, heads,
                                                           (i, j, k, size), which)
            return inf if solve is None else solve[2].objective_s

        def bound(i: int, j: int, size: int,
                  bounds: dict[int, Callable[[int, int], float]] = bounds) -> float:
            return bounds[size](i, j)

        cuts = exact_cuts(len(heads), config.pipeline.stages, allowed, bound, true,
                          sizes=config.sizes, budget=config.budget, micro_batches=config.pipeline.micro_batches,
                          stale=config.pipeline.schedule == "stale", limit_s=limit_s if which == 1 else None,
                          node=cluster.devices_per_node)
        if cuts is None:
            break
        chosen = _Solved()
        for stage, (start, stop) in enumerate(zip(cuts.starts, [*cuts.starts[1:], len(heads)])):
            solve = solves[start, stop, stage, cuts.devices[stage]]
            assert solve is not None, "the cuts chose a stage with no layout"  # its time was finite
            chosen.add(stage, *solve)
        found[which] = (chosen.assignments, _solver_info(chosen.solutions), chosen.explained,
                        replace(config.pipeline, devices_per_stage=cuts.devices, recompute=tuple(chosen.recompute)))
    return [found[which] for which in (0, 1) if which in found]


def _sends_rule_out(config: _Config, heads: Sequence[str], allowed: set[int], profile: Profile, cluster: Cluster,
                    shared: _Shared, limit_s: float) -> bool:
    """Whether a stale configuration cannot come under ``limit_s`` (the best plan found so far) once each stage's
    pace counts its transfer to the next (``cost_models.pipeline_cost``: a stale pipeline moves at least at its
    slowest link's pace) — decided on the lower bounds alone, no stage solved. Only to skip a configuration: its
    cuts are chosen on the stages' tables, which the DP is exact on, as before."""
    if config.pipeline.schedule != "stale":
        return False
    sends = send_floor(config.graph, config.groups, heads, profile, cluster, shared.sends)
    if max(sends(j, size) for j in allowed for size in config.sizes) < limit_s:
        return False  # no transfer reaches the limit: the DP's own bounds decide as before
    bounds = {size: _floor_bound(config, heads, 1, cluster.memory_bytes, size) for size in config.sizes}

    def bound(i: int, j: int, size: int) -> float:
        return max(bounds[size](i, j), sends(j, size))
    return exact_cuts(len(heads), config.pipeline.stages, allowed, bound, lambda i, j, k, size: bound(i, j, size),
                      sizes=config.sizes, budget=config.budget, stale=True, limit_s=limit_s,
                      node=cluster.devices_per_node) is None


def _segment_solve(config: _Config, profile: Profile, cluster: Cluster, settings: SearchSettings,
                   shared: _Shared, heads: Sequence[str], segment: _Segment, which: int) -> _Solve | None:
    """Decisions ``i … j−1`` as stage ``k`` on ``size`` devices, solved once per cost variants (``shared``)."""
    i, j, k, size = segment
    keep, again = config.stage_costs(k, False, size), config.stage_costs(k, True, size)
    key = (id(keep), id(again), i, j)
    if key not in shared.spaces:
        shared.spaces[key] = _StageSpaces(config, profile, cluster, k, heads[i:j], size)
    if (key, which) not in shared.solves:
        shared.solves[key, which] = _best_stage_solve(shared.spaces[key], which, settings)
    return shared.solves[key, which]


def _floor_bound(config: _Config, heads: Sequence[str], which: int, memory_bytes: int,
                 size: int) -> Callable[[int, int], float]:
    """``(i, j) →`` the sum of decisions ``i … j−1``'s cheapest options on ``size`` devices (allreduce in full:
    ``which`` 0, hidden: 1): no stage of them costs less — edges cost nothing or more, memory and recomputing only
    add; ``inf`` where even their leanest options (one micro-batch's activations: the last stage's, or
    recomputing) exceed the memory."""
    leanest = config.stage_costs(config.pipeline.stages - 1, False, size)  # (its seconds: every stage's)
    assert leanest is not None
    seconds, least, hidden = [0.0], [0], which == 1
    for head in heads:
        rows = leanest.rows(config.groups[head])
        seconds.append(seconds[-1] + min(row.seconds(hidden) for row in rows))
        least.append(least[-1] + min(row.memory_bytes for row in rows))
    return lambda i, j: inf if least[j] - least[i] > memory_bytes else seconds[j] - seconds[i]


@dataclass
class _Solved:
    """One allreduce table's stages as solved so far."""

    assignments: dict[str, LayerAssignment] = field(default_factory=dict)
    solutions: list[Solution] = field(default_factory=list)
    explained: dict[str, RunnerUp] = field(default_factory=dict)
    recompute: list[bool] = field(default_factory=list)

    def add(self, stage: int, space: Space, table: CostTable, solution: Solution, recomputes: bool) -> None:
        self.solutions.append(solution)
        self.explained.update(runner_ups(table, solution.choice))
        self.assignments.update({layer: LayerAssignment(layout, stage)
                                 for layer, layout in space.layouts(solution.choice).items()})
        self.recompute.append(recomputes)


class _StageSpaces:
    """Stage ``stage``'s search space on ``size`` devices keeping its activations, and (built when asked)
    recomputing them."""

    def __init__(self, config: _Config, profile: Profile, cluster: Cluster, stage: int,
                 decisions: Sequence[str], size: int) -> None:
        self.config, self.profile, self.cluster, self.stage, self.decisions = config, profile, cluster, stage, decisions
        self.size = size
        self._built: dict[bool, Space] = {}

    def space(self, recompute: bool) -> Space:
        if recompute not in self._built:
            costs = self.config.stage_costs(self.stage, recompute, self.size)
            assert costs is not None  # only asked where can_recompute
            self._built[recompute] = build_space(self.config.graph, self.profile, costs.cluster, costs.devices,
                                                 costs.optimizer, self.cluster.memory_bytes,
                                                 decisions=self.decisions, costs=costs)
        return self._built[recompute]

    @property
    def can_recompute(self) -> bool:
        return self.config.stage_costs(self.stage, True, self.size) is not None


def _best_stage_solve(spaces: _StageSpaces, which: int, settings: SearchSettings) -> _Solve | None:
    """The stage's optimum on allreduce table ``which`` (0 full, 1 hidden), keeping or recomputing its
    activations: recomputing is tried only where keeping them is bound by memory (an optimum the memory limit
    did not cut is also the recomputing table's lower bound: its every option costs as much or more)."""
    found: list[_Solve] = []
    for recompute in (False, True):
        if recompute and (not spaces.can_recompute or (found and found[0][2].solver in UNCONSTRAINED_SOLVERS)):
            break
        space = spaces.space(recompute)
        table = (space.table, space.hidden_allreduce)[which]
        try:
            found.append((space, table, solve_exact(table, settings.solver, settings.time_limit_s), recompute))
        except InputError:  # nothing fits this way
            continue
    return min(found, key=lambda option: (option[2].objective_s, option[3]), default=None)


def _solver_info(solutions: list[Solution]) -> SolverInfo:
    """The stages' solves as one: solvers used, worst status, total seconds and objective, largest gap."""
    optimal = all(solution.status == "Optimal" for solution in solutions)
    gaps = [solution.gap for solution in solutions if solution.gap is not None]
    return SolverInfo("+".join(dict.fromkeys(solution.solver for solution in solutions)),
                      "Optimal" if optimal else "TimeLimit", round(sum(s.seconds for s in solutions), 4),
                      sum(solution.objective_s for solution in solutions),
                      None if len(gaps) < len(solutions) else max(gaps))
