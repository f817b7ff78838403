"""Choosing how to split a model: cost tables, exact solvers, the stage search, what-if sweeps, validation maths.

Works on :class:`cost_models.graph.LayerGraph` and cost tables only: nothing
here imports torch, ``runtime`` or ``calibrate``. The command line and the
public API are the ``parplan`` package's.
"""

from planner.brute_force import solve_brute_force
from planner.chain import solve_chain
from planner.cost_table import CostTable, Solution
from planner.elimination import solve_elimination
from planner.exact import solve_exact
from planner.ilp import available_solvers, solve_ilp

__all__ = ["CostTable", "Solution", "available_solvers", "solve_brute_force",
           "solve_chain", "solve_elimination", "solve_exact", "solve_ilp"]
