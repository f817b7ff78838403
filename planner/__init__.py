"""Choosing how to split a model: cost tables, exact solvers, the stage search, what-if sweeps, validation maths.

Works on :class:`cost_models.ir.graph.LayerGraph` and cost tables only: nothing
here imports torch, ``runtime`` or ``calibrate``. ``space`` prices each layer's
layouts, ``solvers/`` picks them exactly, ``pipeline/`` searches stages and
staleness around that, ``search`` is the whole search with its baselines. The
command line and the public API are the ``parplan`` package's.
"""

from planner.solvers.brute_force import solve_brute_force
from planner.solvers.chain import solve_chain
from planner.solvers.cost_table import CostTable, Solution
from planner.solvers.elimination import solve_elimination
from planner.solvers.exact import solve_exact
from planner.solvers.ilp import available_solvers, solve_ilp

__all__ = ["CostTable", "Solution", "available_solvers", "solve_brute_force",
           "solve_chain", "solve_elimination", "solve_exact", "solve_ilp"]
