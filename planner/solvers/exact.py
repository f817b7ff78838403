"""One entry point for an exact solve.

The shortest path on chains, min-sum elimination on graphs of tree-width two
(residual networks), when their optimum fits in memory; on denser graphs
(DenseNet) a table whose every layer has one option is its own answer (a
pipeline stage of one device); the ILP otherwise (a binding memory limit,
or denser graphs with choices).
"""

from __future__ import annotations

import time

from cost_models.errors import InputError
from planner.solvers.chain import solve_chain
from planner.solvers.cost_table import CostTable, Solution
from planner.solvers.elimination import solve_elimination
from planner.solvers.ilp import solve_ilp

__all__ = ["UNCONSTRAINED_SOLVERS", "solve_exact"]

UNCONSTRAINED_SOLVERS = frozenset({"shortest-path", "elimination", "forced"})
"""Solvers whose solution is the table's optimum without its memory limit (which it meets): no table whose
options cost at least as much — recomputing stages, say — can do better."""


def solve_exact(table: CostTable, solver: str = "cbc", time_limit_s: float | None = None) -> Solution:
    """The optimal option per layer of ``table`` (best found, with its gap, under a time limit).

    Raises:
        InputError: Nothing fits in memory (with how much is missing and what would help).
    """
    free = CostTable(table.layers, table.options, table.node_s, table.edge_s, table.memory_bytes, None)
    try:
        unconstrained = solve_chain(free) if table.is_chain() or len(table.layers) == 1 else solve_elimination(free)
        if table.fits(unconstrained.choice):
            return unconstrained
    except ValueError:  # tree-width above two: the ILP handles any graph
        forced = _forced(table)
        if forced is not None:
            return forced
    try:
        return solve_ilp(table, solver, time_limit_s)
    except ValueError as err:
        least = sum(min(table.memory_bytes[layer]) for layer in table.layers if layer in table.memory_bytes)
        if table.memory_limit_bytes is not None and least > table.memory_limit_bytes:
            raise InputError(
                f"no plan fits: the leanest layouts need {least / 2**30:.2f} GiB per rank, the devices have "
                f"{table.memory_limit_bytes / 2**30:.2f} GiB ({(least - table.memory_limit_bytes) / 2**30:.2f} GiB "
                f"short); use more devices, splits that shrink activations (spatial) and weights (channel), "
                f"or pipeline stages (--max-stages)") from err
        raise InputError(f"the solver found no plan: {err}") from err


def _forced(table: CostTable) -> Solution | None:
    """The only choice of a table whose every layer has one option, when it fits in memory; else ``None``."""
    started = time.perf_counter()
    if any(len(table.options[layer]) != 1 for layer in table.layers):
        return None
    choice = {layer: 0 for layer in table.layers}
    if not table.fits(choice):
        return None  # the ILP reports what is missing
    return Solution(choice, table.objective(choice), "forced", "Optimal", time.perf_counter() - started)
