"""What moving a tensor between two layers' layouts costs: the edge's shape, its two layouts, its seconds.

An edge is free when both ends hold the tensor alike; otherwise its tensor is
redistributed forward (the activation) and back (its gradient). A dense reader
split by filters (``c > 1`` on a convolution or linear layer) wants its input
whole in channels; a tensor that is not 4-D is priced as ``(n, features, 1, 1)``;
a channels-last value is priced in NCHW order (it moves its axes wherever its
order holds them).
"""

from __future__ import annotations

from dataclasses import replace

from typing import Any, Mapping

from cost_models.cluster import Cluster
from cost_models.comm_cost import redistribution_s
from cost_models.layout import Layout
from cost_models.local_problem import DENSE_KINDS
from cost_models.orders import NCDHW, NCHW, NCW, default_order, logical
from cost_models.profile import Profile

__all__ = ["edge_layouts", "edge_move", "edge_s"]


def edge_s(source: Mapping[str, Any], target: Mapping[str, Any], have: Layout, layout: Layout, devices: int,
           profile: Profile, cluster: Cluster, itemsize: int) -> float:
    """Seconds to move ``source``'s output from layout ``have`` to what ``target`` under ``layout`` reads, and back.

    The forward redistribution of the activation plus the backward one of its
    gradient; zero from the model input (loaded in place) and for equal layouts.
    """
    move = edge_move(source, target, have, layout)
    if move is None:
        return 0.0
    shape4, have, want = move
    return (redistribution_s(profile, cluster, shape4, itemsize, have, want, devices)
            + redistribution_s(profile, cluster, shape4, itemsize, want, have, devices))


def edge_layouts(source: Mapping[str, Any], target: Mapping[str, Any], have: Layout,
                 layout: Layout) -> tuple[tuple[int, ...], Layout, Layout] | None:
    """The 4-D shape (5-D of a volume), held and wanted layouts of the edge's tensor; ``None`` for edges free by rule
    (the input).

    Each layout projects on its own: a 2-D tensor keeps ``n`` and ``c``; a
    filter-split reader (``c > 1`` on a convolution or linear layer) wants ``c = 1``.
    """
    shape = source["output_shape"]
    if source["kind"] == "input" or not shape or isinstance(shape[0], list):
        return None
    order = source.get("attrs", {}).get("order") or default_order(len(shape))
    if len(shape) == 4:  # a channels-last value moves its axes wherever its order holds them: priced as nchw
        shape = logical(shape, order)
    if (len(shape) == 5 and order == NCDHW) or (len(shape) == 3 and order == NCW):  # a volume, a sequence
        return tuple(shape), have, _input_layout(target["kind"], layout)
    return _as_4d(shape, have, _input_layout(target["kind"], layout))


def edge_move(source: Mapping[str, Any], target: Mapping[str, Any], have: Layout,
              layout: Layout) -> tuple[tuple[int, ...], Layout, Layout] | None:
    """The tensor shape and the two layouts :func:`edge_s` redistributes between, or ``None`` when it costs nothing."""
    if have == layout and (layout.c == 1 or target["kind"] not in DENSE_KINDS):
        return None  # both project alike (:func:`edge_layouts`)
    move = edge_layouts(source, target, have, layout)
    return None if move is None or move[1] == move[2] else move


def _input_layout(kind: str, layout: Layout) -> Layout:
    return replace(layout, c=1) if kind in DENSE_KINDS and layout.c > 1 else layout


def _as_4d(shape: list[int], have: Layout, want: Layout) -> tuple[tuple[int, ...], Layout, Layout]:
    if len(shape) == 4:
        return tuple(shape), have, want
    features = 1
    for extent in shape[1:]:
        features *= extent
    return (shape[0], features, 1, 1), Layout(n=have.n, c=have.c), Layout(n=want.n, c=want.c)
