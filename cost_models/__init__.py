"""The shared vocabulary of parplan and the arithmetic on it.

``LayerGraph`` (a traced model), ``Layout`` (how a tensor is split),
``Cluster`` (the machines), ``Plan`` (the answer, as versioned JSON), FLOP
counts of local problems, and the errors a person can cause. Nothing here
imports the other parplan packages; torch is imported only by tracing.
"""

from cost_models.cluster import Cluster, Link
from cost_models.errors import InputError, PlanError, TraceError
from cost_models.flops import Flops, layer_flops
from cost_models.graph import LayerGraph, compute_fingerprint, parse_input_shape, trace
from cost_models.layout import Layout
from cost_models.plan import LayerAssignment, Pipeline, Plan, Prediction, SolverInfo, load_plan, save_plan

__all__ = [
    "Cluster",
    "Flops",
    "InputError",
    "LayerAssignment",
    "LayerGraph",
    "Layout",
    "Link",
    "Pipeline",
    "Plan",
    "PlanError",
    "Prediction",
    "SolverInfo",
    "TraceError",
    "compute_fingerprint",
    "layer_flops",
    "load_plan",
    "parse_input_shape",
    "save_plan",
    "trace",
]
