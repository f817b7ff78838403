r"""Exact layout choice on any DAG (residual adds, concatenations) as an integer linear program in PuLP.

Given a :class:`~planner.cost_table.CostTable` with layers ``L``, options
``S_l``, node costs ``c_{l,i}``, edge cost matrices ``d_{e,i,j}`` for edges
``e = (u, v) ∈ E``, per-rank memory ``m_{l,i}`` and limit ``M``:

.. code-block:: text

    minimise    Σ_l Σ_{i∈S_l} c_{l,i} · x_{l,i}  +  Σ_{e=(u,v)} Σ_{i∈S_u} Σ_{j∈S_v} d_{e,i,j} · y_{e,i,j}

    subject to  Σ_{i∈S_l} x_{l,i} = 1                    ∀ l ∈ L              (one option per layer)
                Σ_{j∈S_v} y_{e,i,j} = x_{u,i}            ∀ e=(u,v), i ∈ S_u   (edge rows agree with u)
                Σ_{i∈S_u} y_{e,i,j} = x_{v,j}            ∀ e=(u,v), j ∈ S_v   (edge columns agree with v)
                Σ_l Σ_{i∈S_l} m_{l,i} · x_{l,i} ≤ M                           (memory per rank, if M is set)
                Σ_l x_{l,s_l} ≤ |L| − d                 ∀ s ∈ X              (differ from each excluded plan s
                                                                              in at least d layers, if X is given)
                x_{l,i} ∈ {0, 1},  y_{e,i,j} ∈ [0, 1]

The edge variables are the marginal (local-polytope) linearisation of
``y = x_u·x_v``: with integral ``x`` the two agreement families force
``y_{e,i,j} = x_{u,i}·x_{v,j}``, and its LP relaxation is exact on trees, so
chains solve at the root. Constraint families and the functions that add them:

=====================================  ===========================
one option per layer                   :func:`_add_choice_rows`
edge rows / columns agree with layers  :func:`_add_edge_marginals`
memory per rank                        :func:`_add_memory_limit`
distance from excluded plans           :func:`_add_exclusions`
objective                              :func:`_objective`
=====================================  ===========================

Solvers: CBC (shipped with PuLP) by default, HiGHS when ``highspy`` is
installed and asked for; both with a relative gap of 0 (proven optimal), and
the objective in microseconds so their absolute tolerances are negligible. A time limit returns the best integral plan found,
with status ``"TimeLimit"`` and the gap when the solver reports one. Solving
again with each optimum excluded (no-good cuts) lists the k best distinct
plans in order (``parplan validate``).
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Mapping, Sequence

import pulp

from planner.cost_table import CostTable, Solution

__all__ = ["available_solvers", "solve_ilp"]

_US = 1e6  # objective unit: microseconds


def available_solvers() -> list[str]:
    """Solver names usable here: ``cbc`` always, ``highs`` when highspy is installed."""
    names = ["cbc"]
    if pulp.HiGHS(msg=False).available():
        names.append("highs")
    return names


def solve_ilp(table: CostTable, solver: str = "cbc", time_limit_s: float | None = None,
              exclude: Sequence[Mapping[str, int]] = (), min_difference: int = 1) -> Solution:
    """The optimal (or, under a time limit, best found) option per layer.

    Args:
        exclude: Choices (option index per layer) the solution must differ from, each in at least
            ``min_difference`` layers.

    Raises:
        ValueError: Unknown or unavailable solver, or no feasible plan (memory).
    """
    problem = pulp.LpProblem("parplan_layouts", pulp.LpMinimize)
    x = {(layer, i): problem.add_variable(f"x_{n}_{i}", cat=pulp.LpBinary)
         for n, layer in enumerate(table.layers) for i in range(len(table.options[layer]))}
    y = {(edge, i, j): problem.add_variable(f"y_{k}_{i}_{j}", lowBound=0, upBound=1)
         for k, edge in enumerate(table.edges)
         for i in range(len(table.options[edge[0]])) for j in range(len(table.options[edge[1]]))}
    problem += _objective(table, x, y)
    _add_choice_rows(problem, table, x)
    _add_edge_marginals(problem, table, x, y)
    _add_memory_limit(problem, table, x)
    _add_exclusions(problem, table, x, exclude, min_difference)
    started = time.perf_counter()
    with warnings.catch_warnings():  # PuLP 3 deprecates its bundled CBC runner, which is still the one shipped
        warnings.simplefilter("ignore", DeprecationWarning)
        problem.solve(_solver(solver, time_limit_s))
    seconds = time.perf_counter() - started
    return _solution(problem, table, x, solver, seconds)


def _objective(table: CostTable, x: dict[Any, Any], y: dict[Any, Any]) -> Any:
    """Total seconds, stated in microseconds so the solver's tolerances sit far below a kernel's time."""
    nodes = pulp.lpSum(_US * table.node_s[layer][i] * x[(layer, i)] for layer, i in x)
    edges = pulp.lpSum(_US * table.edge_s[edge][i][j] * var for (edge, i, j), var in y.items() if table.edge_s[edge][i][j])
    return nodes + edges


def _add_choice_rows(problem: Any, table: CostTable, x: dict[Any, Any]) -> None:
    for index, layer in enumerate(table.layers):
        problem += pulp.lpSum(x[(layer, i)] for i in range(len(table.options[layer]))) == 1, f"one_option_{index}"


def _add_edge_marginals(problem: Any, table: CostTable, x: dict[Any, Any], y: dict[Any, Any]) -> None:
    for edge in table.edges:
        u, v = edge
        rows, cols = range(len(table.options[u])), range(len(table.options[v]))
        for i in rows:
            problem += pulp.lpSum(y[(edge, i, j)] for j in cols) == x[(u, i)]
        for j in cols:
            problem += pulp.lpSum(y[(edge, i, j)] for i in rows) == x[(v, j)]


def _add_memory_limit(problem: Any, table: CostTable, x: dict[Any, Any]) -> None:
    if table.memory_limit_bytes is None or not table.memory_bytes:
        return
    used = pulp.lpSum(table.memory_bytes[layer][i] * x[(layer, i)] for layer, i in x if layer in table.memory_bytes)
    problem += used <= table.memory_limit_bytes, "memory_per_rank"


def _add_exclusions(problem: Any, table: CostTable, x: dict[Any, Any], exclude: Sequence[Mapping[str, int]],
                    min_difference: int) -> None:
    for index, choice in enumerate(exclude):
        same = pulp.lpSum(x[(layer, choice[layer])] for layer in table.layers)
        problem += same <= len(table.layers) - min_difference, f"exclude_{index}"


def _solver(name: str, time_limit_s: float | None) -> Any:
    if name == "cbc":
        coin = pulp.COIN_CMD(msg=False, timeLimit=time_limit_s, gapRel=0.0)  # a CBC on PATH or from pulp[cbc]
        return coin if coin.available() else pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, gapRel=0.0)
    if name == "highs":
        highs = pulp.HiGHS(msg=False, timeLimit=time_limit_s, gapRel=0.0)
        if not highs.available():
            raise ValueError("solver 'highs' needs highspy: pip install highspy (or use --solver cbc)")
        return highs
    raise ValueError(f"unknown solver {name!r}; use one of {', '.join(available_solvers())}")


def _solution(problem: Any, table: CostTable, x: dict[Any, Any], solver: str, seconds: float) -> Solution:
    status = pulp.LpStatus[problem.status]
    if problem.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        raise ValueError(f"the ILP has no feasible plan (solver status {status}); "
                         f"more devices, a spatial split or pipeline stages may fit the memory limit")
    choice = {layer: max(range(len(table.options[layer])), key=lambda i: x[(layer, i)].value() or 0.0)
              for layer in table.layers}
    optimal = problem.sol_status == pulp.LpSolutionOptimal
    return Solution(choice, table.objective(choice), solver, "Optimal" if optimal else "TimeLimit", seconds,
                    0.0 if optimal else None)
