"""Plans by rule, unpriced — ``parplan run --layout`` and ``parplan check``'s layouts — and what they leave whole."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

from cost_models.layout import Layout

if TYPE_CHECKING:
    from cost_models.formats.plan import Plan
    from cost_models.ir.graph import LayerGraph

__all__ = ["PARAMETERS_ONLY", "SplitSummary", "WholeLayer", "cannot_split", "layout_plan", "split_reason",
           "split_summary", "uniform_layout_plan"]

_NO_LOCAL_PROBLEM = ("cost_models.capability.predicate accepts it, but cost_models.local_problem gives it no local "
                     "problem")
PARAMETERS_ONLY = ("it computes from parameters and constants alone (no sample, row or column to split): "
                   "whole on every rank")
"""Why a layer kept its output whole when the capability predicate names no reason (the two disagree)."""


class WholeLayer(TypedDict):
    """A compute layer that kept its output whole, and why (``cannot_split``: no split of it exists at all)."""

    layer: str
    kind: str
    reason: str
    cannot_split: bool


class SplitSummary(TypedDict):
    """How many compute layers took a layout (``split`` of ``layers``), and each one that did not."""

    layers: int
    split: int
    whole: list[WholeLayer]


def uniform_layout_plan(graph: LayerGraph, layouts: Sequence[Layout], devices: int, model_spec: str = "") -> Plan:
    """Each layer its first of ``layouts`` then ``n1`` that it can take, on ``devices`` ranks of one machine."""
    from cost_models.cluster import Cluster, Link
    from cost_models.uniform import uniform_plan

    link = Link(0.0, 1e9)  # a container for the device count: this plan is not priced
    cluster = Cluster(devices=devices, devices_per_node=devices, memory_bytes=2**40, intra=link, inter=link,
                      name="this machine")
    return uniform_plan(graph, cluster, [*layouts, Layout()], model_spec=model_spec)


def layout_plan(graph: LayerGraph, layout: Layout, model_spec: str = "") -> Plan:
    """The plan ``parplan run --layout L --nproc R`` runs: each layer its first of ``L, n1`` it can take, on ``R``
    (``L``'s) ranks; not priced (``parplan run`` builds it with :func:`uniform_layout_plan` too)."""
    return uniform_layout_plan(graph, [layout], layout.ranks, model_spec)


def split_summary(graph: LayerGraph, plan: Plan, layout: Layout,
                  reasons: Mapping[str, str] | None = None) -> SplitSummary:
    """How many compute layers of ``plan`` took ``layout``, and why each other one kept its output whole
    (``reasons``: known already, e.g. ``runtime.preflight.shape_fallbacks``')."""
    from cost_models.capability.predicate import layer_refusal

    names = graph.compute_layers()
    batch = graph.batch_layers()
    whole: list[WholeLayer] = []
    for name in names:
        if plan.layers[name].layout != layout:
            node = graph.nodes[name]
            reason = (reasons or {}).get(name) or ((layer_refusal(node, layout, sync_batchnorm=True)
                                                    or _NO_LOCAL_PROBLEM) if name in batch else PARAMETERS_ONLY)
            whole.append({"layer": name, "kind": node.kind, "reason": reason, "cannot_split": cannot_split(reason)})
    return {"layers": len(names), "split": len(names) - len(whole), "whole": whole}


def cannot_split(reason: str) -> bool:
    """Whether a capability reason says no split of the layer exists (not merely one this runtime lacks)."""
    from cost_models.capability.predicate import inherent

    return inherent(reason)


def split_reason(summary: SplitSummary, layout: Layout) -> str:
    """One line: how many layers took ``layout``, how many cannot be split, and the runtime's gaps by cause."""
    gaps = [item for item in summary["whole"] if not item["cannot_split"]]
    text = f"{layout} on {summary['split']} of {summary['layers']} layers"
    if not summary["whole"]:
        return text
    text += f"; {len(summary['whole']) - len(gaps)} cannot be split"
    if gaps:
        counted: dict[str, int] = {}
        for item in gaps:
            key = f"{item['kind']}: {item['reason']}"
            counted[key] = counted.get(key, 0) + 1
        text += f", {len(gaps)} not split by this runtime (" + "; ".join(
            f"{key} ×{count}" if count > 1 else key for key, count in sorted(counted.items())[:3]) + ")"
    return text
