"""One-stage planning: the optimal per-layer layouts for a model on D devices, and the baselines.

``plan_one_stage`` builds the search space (``planner.space``) and solves it
exactly — shortest path when the model is a chain and the optimum fits in
memory, the ILP otherwise — once with each weight-gradient allreduce counted
in full and once with it fully hidden behind backward (the two bounds of the
overlap the additive objective cannot express). Both optima are priced with
the full cost model (``cost_models.estimate``) and the faster is returned,
with two baselines priced the same way: pure sample parallelism, and the best
single layout used for every layer.

The memory limit applies to what stays resident on a rank (weights,
gradients, optimizer state, saved activations); the transients of one layer
come on top and are reported in the prediction. Pipeline stages are not
searched here yet.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any, Mapping

from cost_models.cluster import Cluster
from cost_models.errors import InputError
from cost_models.estimate import Estimate, estimate
from cost_models.layout import Layout
from cost_models.plan import LayerAssignment, Pipeline, Plan, Prediction, SolverInfo
from cost_models.profile import Profile
from planner.chain import solve_chain
from planner.cost_table import CostTable, Solution
from planner.ilp import solve_ilp
from planner.space import Space, build_space

__all__ = ["Baseline", "PlanResult", "plan_one_stage"]


@dataclass(frozen=True)
class Baseline:
    """A plan a user might pick by hand, and what the cost model predicts for it."""

    name: str
    plan: Plan
    estimate: Estimate


@dataclass(frozen=True)
class PlanResult:
    """The optimal plan, its estimate, the baselines, and the search space's size."""

    plan: Plan
    estimate: Estimate
    baselines: tuple[Baseline, ...]
    candidates: int


def plan_one_stage(graph: Any, profile: Profile, cluster: Cluster, solver: str = "cbc",
                   time_limit_s: float | None = None, optimizer: str = "sgd", model_spec: str = "") -> PlanResult:
    """The least predicted time plan on all of ``cluster``'s devices as one stage.

    Raises:
        InputError: No plan fits in memory (with how much is missing) or a layer cannot be placed.
    """
    space = build_space(graph, profile, cluster, cluster.devices, optimizer, cluster.memory_bytes)
    found = []
    for table in (space.table, space.hidden_allreduce):  # allreduce counted in full / fully hidden
        solution = _solve(table, solver, time_limit_s)
        layouts = {name: space.candidates[name][index] for name, index in solution.choice.items()}
        info = SolverInfo(solution.solver, solution.status, round(solution.seconds, 4), solution.objective_s,
                          solution.gap)
        predicted = estimate(graph, _plan(graph, cluster, layouts, None, info, model_spec), profile,
                             optimizer=optimizer)
        found.append((predicted.iteration_s, len(found), layouts, info, predicted))
    _, _, layouts, info, predicted = min(found)
    plan = _plan(graph, cluster, layouts, predicted, info, model_spec)
    candidates = sum(len(options) for options in space.candidates.values())
    return PlanResult(plan, predicted, _baselines(graph, profile, cluster, space, optimizer), candidates)


def _solve(table: CostTable, solver: str, time_limit_s: float | None) -> Solution:
    if table.is_chain():
        free = CostTable(table.layers, table.options, table.node_s, table.edge_s, table.memory_bytes, None)
        path = solve_chain(free)
        if table.fits(path.choice):
            return path
    try:
        return solve_ilp(table, solver, time_limit_s)
    except ValueError as err:
        least = sum(min(table.memory_bytes[layer]) for layer in table.layers)
        if table.memory_limit_bytes is not None and least > table.memory_limit_bytes:
            raise InputError(
                f"no plan fits: the leanest layouts need {least / 2**30:.2f} GiB per rank, the devices have "
                f"{table.memory_limit_bytes / 2**30:.2f} GiB; use more devices, or splits that shrink activations "
                f"(spatial) and weights (channel)") from err
        raise InputError(f"the solver found no plan: {err}") from err


def _plan(graph: Any, cluster: Cluster, layouts: Mapping[str, Layout], predicted: Estimate | None,
          solver: SolverInfo | None, model_spec: str) -> Plan:
    prediction = None if predicted is None else Prediction(predicted.iteration_s, predicted.memory_bytes_max,
                                                           dict(predicted.breakdown_s))
    return Plan(graph.fingerprint, tuple(graph.input_shape), graph.graph["dtype"], cluster,  # type: ignore[arg-type]
                {name: LayerAssignment(layout) for name, layout in layouts.items()},
                Pipeline(1, (cluster.devices,)), prediction, solver, model_spec,
                _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))


def _baselines(graph: Any, profile: Profile, cluster: Cluster, space: Space, optimizer: str) -> tuple[Baseline, ...]:
    found = []
    batch = graph.input_shape[0]
    sample = max(d for d in range(1, cluster.devices + 1) if cluster.devices % d == 0 and d <= batch)
    uniform = {name: Layout(n=sample) for name in space.candidates}
    if all(uniform[name] in space.candidates[name] for name in uniform):
        found.append(_baseline("pure sample", graph, profile, cluster, uniform, optimizer))
    best = _best_single_layout(space)
    if best is not None:
        found.append(_baseline(f"best single layout ({best})", graph, profile, cluster,
                               {name: best for name in space.candidates}, optimizer))
    return tuple(found)


def _best_single_layout(space: Space) -> Layout | None:
    table, shared = space.table, None
    for options in space.candidates.values():
        shared = set(options) if shared is None else shared & set(options)
    scored = []
    for layout in shared or ():
        choice = {name: space.candidates[name].index(layout) for name in table.layers}
        if table.fits(choice):
            scored.append((table.objective(choice), layout.parts(), layout))
    return min(scored)[2] if scored else None


def _baseline(name: str, graph: Any, profile: Profile, cluster: Cluster, layouts: Mapping[str, Layout],
              optimizer: str) -> Baseline:
    plan = _plan(graph, cluster, layouts, None, None, "")
    return Baseline(name, plan, estimate(graph, plan, profile, optimizer=optimizer))
