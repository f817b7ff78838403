r"""Exact layout choice on any DAG (residual adds, concatenations) as a 0/1 integer linear program.

Given a :class:`~planner.solvers.cost_table.CostTable` with layers ``L``, options
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
chains solve at the root.

The program is built once, solver-neutral, as sparse matrices
(:class:`~planner.solvers.ilp_backends.IlpModel`): the columns are ``x`` layer by
layer, then ``y`` edge by edge (``i``-major), the rows in the order of the
families above. Constraint families and the functions that build them:

=====================================  ===========================
one option per layer                   :func:`_choice_rows`
edge rows / columns agree with layers  :func:`_edge_marginal_rows`
memory per rank                        :func:`_memory_row`
distance from excluded plans           :func:`_exclusion_rows`
objective                              :func:`_objective_us`
=====================================  ===========================

Solvers: with PuLP installed, CBC (shipped with PuLP) by default, HiGHS when
``highspy`` is installed and asked for. Without PuLP (``BACKEND == "scipy"``;
a bare GPU machine), both ``cbc`` and ``highs`` are served by
``scipy.optimize.milp`` — the HiGHS that SciPy ships — on the same matrices,
and the solution names its solver ``scipy-highs``. Every back end runs with
a relative gap of 0 (proven optimal), and the objective is in microseconds
so their absolute tolerances are negligible. A time limit returns the best
integral plan found, with status ``"TimeLimit"`` and the gap when the solver
reports one. Solving again with each optimum excluded (no-good cuts) lists
the k best distinct plans in order (``parplan validate``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_array

from planner.solvers.cost_table import CostTable, Solution
from planner.solvers.ilp_backends import (
    SCIPY_SOLVER,
    BackendResult,
    IlpModel,
    pulp_available,
    pulp_solvers,
    solve_with_pulp,
    solve_with_scipy,
)

__all__ = ["BACKEND", "available_solvers", "build_model", "solve_ilp"]

BACKEND: str = "pulp" if pulp_available() else "scipy"
"""Which back end :func:`solve_ilp` uses: ``pulp`` when PuLP imports, else ``scipy`` (tests set it)."""

SOLVER_NAMES = ("cbc", "highs")
_US = 1e6  # objective unit: microseconds


def available_solvers() -> list[str]:
    """Solver names :func:`solve_ilp` accepts here.

    With PuLP: ``cbc`` always, ``highs`` when highspy is installed. Without it both names, each
    solved by SciPy's HiGHS.
    """
    return pulp_solvers() if BACKEND == "pulp" else list(SOLVER_NAMES)


def solve_ilp(table: CostTable, solver: str = "cbc", time_limit_s: float | None = None,
              exclude: Sequence[Mapping[str, int]] = (), min_difference: int = 1) -> Solution:
    """The optimal (or, under a time limit, best found) option per layer.

    Args:
        exclude: Choices (option index per layer) the solution must differ from, each in at least
            ``min_difference`` layers.

    Raises:
        ValueError: Unknown or unavailable solver, or no feasible plan (memory).
    """
    if solver not in SOLVER_NAMES:
        raise ValueError(f"unknown solver {solver!r}; use one of {', '.join(available_solvers())}")
    columns = _Columns.of(table)
    model = build_model(table, exclude, min_difference, columns)
    if BACKEND == "pulp":
        return _solution(table, columns, solve_with_pulp(model, solver, time_limit_s), solver)
    return _solution(table, columns, solve_with_scipy(model, time_limit_s), SCIPY_SOLVER)


@dataclass(frozen=True)
class _Columns:
    """Where each layer's ``x`` and each edge's ``y`` start among the variables."""

    x_start: Mapping[str, int]
    y_start: Mapping[tuple[str, str], int]
    count: int

    @classmethod
    def of(cls, table: CostTable) -> _Columns:
        x_start, position = {}, 0
        for layer in table.layers:
            x_start[layer], position = position, position + len(table.options[layer])
        y_start = {}
        for edge in table.edges:
            y_start[edge], position = position, position + len(table.options[edge[0]]) * len(table.options[edge[1]])
        return cls(x_start, y_start, position)


class _Rows:
    """Constraint rows as they are built: columns, coefficients, bounds and names, then one CSR matrix."""

    def __init__(self) -> None:
        self.columns: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.names: list[str | None] = []

    def add(self, columns: np.ndarray, values: np.ndarray, lower: float, upper: float, name: str | None = None) -> None:
        self.columns.append(np.asarray(columns, dtype=np.int64))
        self.values.append(np.asarray(values, dtype=float))
        self.lower.append(lower)
        self.upper.append(upper)
        self.names.append(name)

    def matrix(self, width: int) -> csr_array:
        indptr = np.concatenate([[0], np.cumsum([len(c) for c in self.columns], dtype=np.int64)])
        data = np.concatenate(self.values) if self.values else np.zeros(0)
        indices = np.concatenate(self.columns) if self.columns else np.zeros(0, dtype=np.int64)
        return csr_array((data, indices, indptr), shape=(len(self.columns), width))


def build_model(table: CostTable, exclude: Sequence[Mapping[str, int]] = (), min_difference: int = 1,
                columns: _Columns | None = None) -> IlpModel:
    """The ILP of the module docstring as matrices, for either back end."""
    columns = columns or _Columns.of(table)
    rows = _Rows()
    _choice_rows(rows, table, columns)
    _edge_marginal_rows(rows, table, columns)
    _memory_row(rows, table, columns)
    _exclusion_rows(rows, table, columns, exclude, min_difference)
    binary = np.zeros(columns.count, dtype=bool)
    binary[:sum(len(table.options[layer]) for layer in table.layers)] = True
    return IlpModel(_names(table), _objective_us(table, columns), binary, rows.matrix(columns.count),
                    np.array(rows.lower, dtype=float), np.array(rows.upper, dtype=float), tuple(rows.names))


def _names(table: CostTable) -> tuple[str, ...]:
    xs = [f"x_{n}_{i}" for n, layer in enumerate(table.layers) for i in range(len(table.options[layer]))]
    ys = [f"y_{k}_{i}_{j}" for k, (u, v) in enumerate(table.edges)
          for i in range(len(table.options[u])) for j in range(len(table.options[v]))]
    return tuple(xs + ys)


def _objective_us(table: CostTable, columns: _Columns) -> np.ndarray:
    """Total seconds, stated in microseconds so the solver's tolerances sit far below a kernel's time."""
    cost = np.zeros(columns.count)
    for layer, start in columns.x_start.items():
        cost[start:start + len(table.options[layer])] = [_US * value for value in table.node_s[layer]]
    for edge, start in columns.y_start.items():
        flat = [_US * value for row in table.edge_s[edge] for value in row]
        cost[start:start + len(flat)] = flat
    return cost


def _choice_rows(rows: _Rows, table: CostTable, columns: _Columns) -> None:
    for index, layer in enumerate(table.layers):
        size = len(table.options[layer])
        rows.add(columns.x_start[layer] + np.arange(size), np.ones(size), 1.0, 1.0, f"one_option_{index}")


def _edge_marginal_rows(rows: _Rows, table: CostTable, columns: _Columns) -> None:
    for edge in table.edges:
        u, v = edge
        width, height, start = len(table.options[v]), len(table.options[u]), columns.y_start[edge]
        for i in range(height):  # Σ_j y_{e,i,j} − x_{u,i} = 0
            rows.add(np.append(start + i * width + np.arange(width), columns.x_start[u] + i),
                     np.append(np.ones(width), -1.0), 0.0, 0.0)
        for j in range(width):  # Σ_i y_{e,i,j} − x_{v,j} = 0
            rows.add(np.append(start + j + width * np.arange(height), columns.x_start[v] + j),
                     np.append(np.ones(height), -1.0), 0.0, 0.0)


def _memory_row(rows: _Rows, table: CostTable, columns: _Columns) -> None:
    if table.memory_limit_bytes is None or not table.memory_bytes:
        return
    held = [layer for layer in table.layers if layer in table.memory_bytes]
    rows.add(np.concatenate([columns.x_start[layer] + np.arange(len(table.options[layer])) for layer in held]),
             np.concatenate([np.asarray(table.memory_bytes[layer], dtype=float) for layer in held]),
             -np.inf, float(table.memory_limit_bytes), "memory_per_rank")


def _exclusion_rows(rows: _Rows, table: CostTable, columns: _Columns, exclude: Sequence[Mapping[str, int]],
                    min_difference: int) -> None:
    for index, choice in enumerate(exclude):
        for layer in table.layers:
            if not 0 <= choice[layer] < len(table.options[layer]):
                raise ValueError(f"excluded plan {index} gives layer {layer!r} option {choice[layer]}, but it has "
                                 f"{len(table.options[layer])} options; pass option indices of this table")
        same = np.array([columns.x_start[layer] + choice[layer] for layer in table.layers])
        rows.add(same, np.ones(len(same)), -np.inf, float(len(table.layers) - min_difference), f"exclude_{index}")


def _solution(table: CostTable, columns: _Columns, found: BackendResult, solver: str) -> Solution:
    if found.values is None:
        raise ValueError(f"the ILP has no feasible plan (solver status {found.status}); "
                         f"more devices, a spatial split or pipeline stages may fit the memory limit")
    choice = {layer: int(np.argmax(found.values[start:start + len(table.options[layer])]))
              for layer, start in columns.x_start.items()}
    return Solution(choice, table.objective(choice), solver, "Optimal" if found.optimal else "TimeLimit",
                    found.seconds, found.gap)
