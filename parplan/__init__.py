"""parplan: plan and run sample / spatial / channel / pipeline parallel training of a PyTorch model.

The one namespace a training script imports::

    import parplan

    graph = parplan.trace(model, (8, 3, 2048, 2048))
    result = parplan.plan(graph, profile="h100", devices=64,
                          settings=parplan.SearchSettings(max_stages=4))
    parplan.save_plan(result.plan, "plan.json")
    # on every rank, inside torch.distributed:
    distributed = parplan.apply_plan(model, parplan.load_plan("plan.json"))

Names load on first use, so ``import parplan`` (and the command line's start) does not import torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what each name is; at run time each loads on first use (``__getattr__``)
    from cost_models.cluster import Cluster
    from cost_models.estimate import Estimate
    from cost_models.formats.plan import Plan, load_plan, save_plan
    from cost_models.ir.graph import LayerGraph
    from cost_models.layout import Layout
    from cost_models.profile import Profile
    from parplan.api import cluster, estimate, load_profile, plan, trace, whatif
    from planner.settings import SearchSettings
    from runtime.apply import apply_plan
    from runtime.pipeline.stage import apply_pipeline

__all__ = ["Cluster", "Estimate", "LayerGraph", "Layout", "Plan", "Profile", "SearchSettings", "apply_pipeline",
           "apply_plan", "cluster", "estimate", "load_plan", "load_profile", "plan", "save_plan", "trace", "whatif"]

_WHERE = {
    "Cluster": "cost_models.cluster", "Estimate": "cost_models.estimate", "LayerGraph": "cost_models.ir.graph",
    "Layout": "cost_models.layout", "Plan": "cost_models.formats.plan", "Profile": "cost_models.profile",
    "SearchSettings": "planner.settings", "apply_pipeline": "runtime.pipeline.stage", "apply_plan": "runtime.apply",
    "cluster": "parplan.api", "estimate": "parplan.api", "load_plan": "cost_models.formats.plan",
    "load_profile": "parplan.api", "plan": "parplan.api", "save_plan": "cost_models.formats.plan",
    "trace": "parplan.api", "whatif": "parplan.api",
}


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module 'parplan' has no attribute {name!r}; its names: {', '.join(__all__)}")
    value = getattr(import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
