"""The shared vocabulary of parplan and the arithmetic on it.

``LayerGraph`` (a traced model), ``Layout`` (how a tensor is split),
``Cluster`` (the machines), ``Profile`` (what calibration measured),
``Plan`` (the answer, as versioned JSON), the local problem of a layer under a
layout, and ``estimate`` (time and memory of a plan). Nothing here imports the
other parplan packages; torch is imported only by tracing.
"""

from cost_models.cluster import Cluster, Link
from cost_models.errors import InputError, PlanError, TraceError
from cost_models.estimate import Estimate, estimate
from cost_models.formats.plan import LayerAssignment, Pipeline, Plan, Prediction, SolverInfo, load_plan, save_plan
from cost_models.ir.flops import Flops, layer_flops
from cost_models.ir.graph import LayerGraph, compute_fingerprint, dtype_itemsize, parse_input_shape, parse_input_shapes
from cost_models.layout import Layout
from cost_models.local_problem import LocalProblem, local_problem
from cost_models.profile import Profile, ProfileError, load_profile, save_profile

__all__ = [
    "Cluster",
    "Estimate",
    "Flops",
    "InputError",
    "LayerAssignment",
    "LayerGraph",
    "Layout",
    "Link",
    "LocalProblem",
    "Pipeline",
    "Plan",
    "PlanError",
    "Prediction",
    "Profile",
    "ProfileError",
    "SolverInfo",
    "TraceError",
    "compute_fingerprint",
    "dtype_itemsize",
    "estimate",
    "layer_flops",
    "load_plan",
    "load_profile",
    "local_problem",
    "parse_input_shape",
    "parse_input_shapes",
    "save_plan",
    "save_profile",
]
