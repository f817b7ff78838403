"""Choosing how to split a model: search spaces, exact solvers, stages, what-if sweeps.

Works on :class:`cost_models.graph.LayerGraph` and cost tables only; nothing
here imports torch except the command line (``planner/cli.py``), which loads
models lazily.
"""

from planner.report import format_bytes, format_count

__all__ = ["format_bytes", "format_count"]
