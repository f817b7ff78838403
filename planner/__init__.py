"""Choosing how to split a model: cost tables, exact solvers, reports, and the ``parplan`` command.

Works on :class:`cost_models.graph.LayerGraph` and cost tables only; nothing
here imports torch except the command line (``planner/cli.py``), which loads
models lazily.
"""

from planner.brute_force import solve_brute_force
from planner.chain import solve_chain
from planner.cost_table import CostTable, Solution
from planner.elimination import solve_elimination
from planner.exact import solve_exact
from planner.ilp import available_solvers, solve_ilp
from planner.report import format_bytes, format_count

__all__ = ["CostTable", "Solution", "available_solvers", "format_bytes", "format_count", "solve_brute_force",
           "solve_chain", "solve_elimination", "solve_exact", "solve_ilp"]
