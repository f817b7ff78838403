"""What moving a tensor between two layers' layouts costs: the edge's shape, its two layouts, its seconds.

An edge is free when both ends hold the tensor alike; otherwise its tensor is
redistributed forward (the activation) and back (its gradient). A dense reader
split by filters (``c > 1`` on a convolution or linear layer) wants its input
whole in channels; a tensor that is not 4-D is priced as ``(n, features, 1, 1)``;
a channels-last value is priced in NCHW order (it moves its axes wherever its
order holds them), and tokens ``(N, L, E)`` as the sequence ``(N, E, L)``.
A channels-last linear layer split by filters adds the seconds of its form,
which its input edge decides (``cost_models.dense_forms``): its row form
reads the input where it is.
"""

from __future__ import annotations

from dataclasses import replace

from cost_models.cluster import Cluster
from cost_models.comm_cost import redistribution_s
from cost_models.dense_forms import form_s, has_forms, row_form
from cost_models.ir.kinds import DENSE_KINDS
from cost_models.ir.layer import Layer
from cost_models.ir.orders import NCDHW, NCW, default_order, logical
from cost_models.layout import Layout, whole_channels
from cost_models.profile import Profile

__all__ = ["edge_frame", "edge_free", "edge_layouts", "edge_move", "edge_s", "projected", "reader_layout"]


def edge_s(source: Layer, target: Layer, have: Layout, layout: Layout, devices: int,
           profile: Profile, cluster: Cluster, itemsize: int) -> float:
    """Seconds to move ``source``'s output from layout ``have`` to what ``target`` under ``layout`` reads, and back.

    The forward redistribution of the activation plus the backward one of its
    gradient (zero from the model input, loaded in place, and for equal layouts),
    plus the seconds of the reader's form (``cost_models.dense_forms``).
    """
    formed = form_s(source, target, have, layout, profile, cluster, itemsize)
    move = edge_move(source, target, have, layout)
    if move is None:
        return formed
    shape4, held, want = move
    return formed + (redistribution_s(profile, cluster, shape4, itemsize, held, want, devices)
                     + redistribution_s(profile, cluster, shape4, itemsize, want, held, devices))


def edge_free(source: Layer, target: Layer, have: Layout, layout: Layout) -> bool:
    """Whether the edge costs nothing: no move, and no form of the reader priced on it."""
    return not has_forms(source, target, layout) and edge_move(source, target, have, layout) is None


def edge_layouts(source: Layer, target: Layer, have: Layout,
                 layout: Layout) -> tuple[tuple[int, ...], Layout, Layout] | None:
    """The 4-D shape (5-D of a volume), held and wanted layouts of the edge's tensor; ``None`` for edges free by rule
    (the input).

    Each layout projects on its own: a 2-D tensor keeps ``n`` and ``c``; a
    filter-split reader (``c > 1`` on a convolution or linear layer) wants ``c = 1``.
    """
    frame = edge_frame(source)
    if frame is None:
        return None
    shape, flat = frame
    return shape, projected(have, flat), projected(reader_layout(target.kind, layout), flat)


def edge_frame(source: Layer) -> tuple[tuple[int, ...], bool] | None:
    """The shape ``source``'s output moves as (4-D, 5-D of a volume, 3-D of a sequence, else ``(n, features, 1,
    1)``) and whether it is held flattened (its layouts keep only ``n`` and ``c``); ``None`` for the input (loaded
    in place) and tuples of tensors (kept whole)."""
    shape = source.output_shape
    if source.kind == "input" or not shape or isinstance(shape[0], list):
        return None
    order = source.attrs.get("order") or default_order(len(shape))
    if len(shape) == 4:  # a channels-last value moves its axes wherever its order holds them: priced as nchw
        return tuple(logical(shape, order)), False
    if (len(shape) == 5 and order == NCDHW) or (len(shape) == 3 and order == NCW):  # a volume, a sequence
        return tuple(shape), False
    if len(shape) == 3 and len(order) == 3 and "w" in order:  # tokens (nwc): priced as a sequence (N, E, L)
        return tuple(logical(shape, order)[:2]) + (int(shape[order.index("w")]),), False
    features = 1
    for extent in shape[1:]:
        features *= extent
    return (shape[0], features, 1, 1), True


def projected(layout: Layout, flat: bool) -> Layout:
    """``layout`` as a tensor of :func:`edge_frame` holds it (flattened: its ``n`` and ``c`` only)."""
    return Layout(n=layout.n, c=layout.c) if flat else layout


def reader_layout(kind: str, layout: Layout) -> Layout:
    """The layout a ``kind`` layer under ``layout`` reads its input in: a filter split reads channels whole, and
    attention split by tokens reads every token (its keys and values; its queries are a part of them)."""
    if kind in DENSE_KINDS and layout.c > 1:
        return whole_channels(layout)
    return replace(layout, c=1, w=1) if kind == "attention" else layout  # (heads: its input whole in channels)


def edge_move(source: Layer, target: Layer, have: Layout,
              layout: Layout) -> tuple[tuple[int, ...], Layout, Layout] | None:
    """The tensor shape and the two layouts :func:`edge_s` redistributes between, or ``None`` when it costs nothing."""
    if have == layout and (reader_layout(target.kind, layout) == layout or row_form(source, target, have, layout)):
        return None  # both project alike (:func:`edge_layouts`), or a row-form reader reads it where it is
    move = edge_layouts(source, target, have, layout)
    return None if move is None or move[1] == move[2] else move
