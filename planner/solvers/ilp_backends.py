"""A 0/1 ILP in matrix form, and the two back ends that solve it: PuLP (CBC or HiGHS) and ``scipy.optimize.milp``.

:mod:`planner.solvers.ilp` states the layout problem once as an :class:`IlpModel` —
``min cost·v`` subject to ``lower ≤ A·v ≤ upper``, ``0 ≤ v ≤ 1`` and ``v_k``
integral where ``binary[k]`` — and hands it to one of these functions. PuLP is
optional: without it (a bare GPU machine) :func:`solve_with_scipy` solves the
same matrices with the HiGHS that SciPy ships. Both ask for a relative gap of
0 (proven optimal) and honour a time limit, after which the best integral
point found is returned with ``optimal=False``.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_array

try:  # optional: the scipy back end serves when PuLP is not installed
    import pulp
except ImportError:  # pragma: no cover - exercised by tests that hide the package
    pulp = None

__all__ = ["BackendResult", "IlpModel", "SCIPY_SOLVER", "pulp_available", "pulp_solvers", "solve_with_pulp",
           "solve_with_scipy"]

SCIPY_SOLVER = "scipy-highs"
"""The solver name a :class:`~planner.solvers.cost_table.Solution` found by :func:`solve_with_scipy` carries."""

_SCIPY_STATUS = {0: "Optimal", 1: "Not Solved", 2: "Infeasible", 3: "Unbounded", 4: "Undefined"}


@dataclass(frozen=True)
class IlpModel:
    """``min cost·v`` s.t. ``lower ≤ matrix·v ≤ upper``, ``0 ≤ v ≤ 1``, ``v_k ∈ {0, 1}`` where ``binary[k]``

    Attributes:
        names: One name per variable (column), as PuLP writes them.
        cost: Objective coefficient per variable.
        binary: Whether each variable is integral.
        matrix: The constraint rows (explicit zeros kept: PuLP receives the rows exactly as built).
        lower: Each row's lower bound (``-inf``: none; equal to ``upper``: an equality).
        upper: Each row's upper bound.
        row_names: Each row's name, ``None`` for PuLP's automatic one.
    """

    names: tuple[str, ...]
    cost: np.ndarray
    binary: np.ndarray
    matrix: csr_array
    lower: np.ndarray
    upper: np.ndarray
    row_names: tuple[str | None, ...]


@dataclass(frozen=True)
class BackendResult:
    """What a back end found: variable values (``None``: no integral point), status, optimality, gap, solve time."""

    values: np.ndarray | None
    status: str
    optimal: bool
    gap: float | None
    seconds: float = 0.0


def pulp_available() -> bool:
    """Whether PuLP can be imported here."""
    return pulp is not None


def pulp_solvers() -> list[str]:
    """PuLP's solvers usable here: ``cbc`` always, ``highs`` when highspy is installed."""
    names = ["cbc"]
    if pulp is not None and pulp.HiGHS(msg=False).available():
        names.append("highs")
    return names


def solve_with_pulp(model: IlpModel, solver: str, time_limit_s: float | None) -> BackendResult:
    """Solve ``model`` with PuLP's ``solver`` (``cbc`` or ``highs``)."""
    problem = pulp.LpProblem("parplan_layouts", pulp.LpMinimize)
    variables = [problem.add_variable(name, cat=pulp.LpBinary) if integral
                 else problem.add_variable(name, lowBound=0, upBound=1)
                 for name, integral in zip(model.names, model.binary)]
    problem += pulp.LpAffineExpression(  # binaries always named, continuous variables when they cost something
        [(variables[k], float(model.cost[k])) for k in range(len(variables)) if model.binary[k] or model.cost[k]])
    for row in range(model.matrix.shape[0]):
        problem += _pulp_row(model, variables, row)
    started = time.perf_counter()
    with warnings.catch_warnings():  # PuLP 3 deprecates its bundled CBC runner, which is still the one shipped
        warnings.simplefilter("ignore", DeprecationWarning)
        problem.solve(_pulp_solver(solver, time_limit_s))
    seconds = time.perf_counter() - started
    if problem.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return BackendResult(None, pulp.LpStatus[problem.status], False, None, seconds)
    optimal = problem.sol_status == pulp.LpSolutionOptimal
    values = np.array([variable.value() or 0.0 for variable in variables])
    return BackendResult(values, pulp.LpStatus[problem.status], optimal, 0.0 if optimal else None, seconds)


def _pulp_row(model: IlpModel, variables: list[pulp.LpVariable], row: int) -> pulp.LpConstraint:
    start, stop = model.matrix.indptr[row], model.matrix.indptr[row + 1]
    expression = pulp.LpAffineExpression(
        [(variables[column], float(value))
         for column, value in zip(model.matrix.indices[start:stop], model.matrix.data[start:stop])])
    lower, upper = float(model.lower[row]), float(model.upper[row])
    if lower == upper:
        sense, rhs = pulp.LpConstraintEQ, upper
    elif math.isinf(lower):
        sense, rhs = pulp.LpConstraintLE, upper
    else:
        sense, rhs = pulp.LpConstraintGE, lower
    return pulp.LpConstraint(expression, sense, model.row_names[row], rhs)


def _pulp_solver(name: str, time_limit_s: float | None) -> pulp.LpSolver:
    if name == "cbc":
        coin = pulp.COIN_CMD(msg=False, timeLimit=time_limit_s, gapRel=0.0)  # a CBC on PATH or from pulp[cbc]
        return coin if coin.available() else pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, gapRel=0.0)
    highs = pulp.HiGHS(msg=False, timeLimit=time_limit_s, gapRel=0.0)
    if not highs.available():
        raise ValueError("solver 'highs' needs highspy: pip install highspy (or use --solver cbc)")
    return highs


def solve_with_scipy(model: IlpModel, time_limit_s: float | None) -> BackendResult:
    """Solve ``model`` with ``scipy.optimize.milp`` (HiGHS), relative gap 0."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    options: dict[str, bool | float] = {"disp": False, "mip_rel_gap": 0.0}
    if time_limit_s is not None:
        options["time_limit"] = float(time_limit_s)
    constraints = [LinearConstraint(model.matrix, model.lower, model.upper)] if model.matrix.shape[0] else []
    started = time.perf_counter()
    result = milp(model.cost, integrality=model.binary.astype(np.int8), bounds=Bounds(0.0, 1.0),
                  constraints=constraints, options=options)
    seconds = time.perf_counter() - started
    status = _SCIPY_STATUS.get(result.status, "Undefined")
    if result.x is None:
        return BackendResult(None, status, False, None, seconds)
    optimal = result.status == 0
    gap = getattr(result, "mip_gap", None)
    return BackendResult(np.asarray(result.x, dtype=float), status, optimal,
                         0.0 if optimal else (float(gap) if gap is not None and math.isfinite(gap) else None), seconds)
