"""What the tracer adds to a layer's attributes from the graph traced so far (``cost_models.ir.tracing``): the orders
of its value and inputs (``cost_models.ir.orders``), TensorFlow-'SAME' pads from its input's extent
(``cost_models.ir.classify.TF_SAME``), and a convolution call's filters (``F.conv2d(x, standardise(w))``); and, on
the assembled graph, ``F.pad`` amounts computed from shapes and each layer's autocast dtype (mixed precision)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import networkx as nx

from cost_models.ir.classify import KindInfo, tf_same_pads
from cost_models.ir.graph import AMP_DTYPES, compute_fingerprint
from cost_models.ir.orders import (
    NCW,
    default_order,
    output_order,
    piece_order,
    reduced,
    sequence_layer,
    stacked,
    unknown_order,
)

if TYPE_CHECKING:
    from torch.fx import Node

    from cost_models.ir.graph import LayerGraph

__all__ = ["TensorMeta", "record_amp", "record_pads", "shape_attrs", "with_orders"]

TensorMeta = list[tuple[tuple[int, ...], int]]
"""Per node: (shape, itemsize) of each tensor it produced."""


def shape_attrs(graph: LayerGraph, kind: str, attrs: dict[str, Any], inputs: list[str],
                parameter_weight: bool) -> dict[str, Any]:
    """TensorFlow-'SAME' pads (``attrs["pads"]``); a convolution call's kernel size and whether its filters come
    from the batch (``weight_from_batch``; a parameter's never do)."""
    extra: dict[str, Any] = {}
    if attrs.get("padding") == "tf_same":
        extra["pads"] = tf_same_pads(attrs, graph.nodes[inputs[0]].output_shape[2:])
    if kind == "conv" and attrs.get("function_form"):
        extra.update(_function_conv_attrs(graph, inputs[1]) if len(inputs) > 1 else
                     {"weight_from_batch": False} if parameter_weight else {})
    return extra


def _unordered(shapes: list[Any]) -> tuple[str, Any] | None:
    """The first input, with no order (``""``), when none has one: what a reshape of it makes depends on its shape."""
    return next((("", shape) for shape in shapes if shape and all(isinstance(extent, int) for extent in shape)), None)


def with_orders(node: Node, info: KindInfo, meta: TensorMeta, graph: LayerGraph, orders: dict[str, str]) -> KindInfo:
    """``info`` with the orders of its value and inputs where they are not the default (``cost_models.ir.orders``)."""
    inputs = [src.name for src in node.all_input_nodes if src.name in graph]
    shapes = [graph.nodes[name].output_shape for name in inputs]
    input_orders = [orders.get(name, default_order(len(shape))) for name, shape in zip(inputs, shapes)]
    source = next(((order, shape) for order, shape in zip(input_orders, shapes)
                   if order and all(isinstance(extent, int) for extent in shape)), None)
    named = {order for order, shape in zip(input_orders, shapes) if order}
    if info.kind == "cat" and (len(named) > 1 or any(not order and len(shape) == 4 for order, shape in
                                                     zip(input_orders, shapes))):
        source = None  # a concatenation of values in several orders is in PyTorch's (a class token: in its reader's)
    if len(meta) == 1 and source and ("stack_dim" in info.attrs or info.attrs.get("keepdim") is not None):
        order = _stacked_or_reduced(info.attrs, input_orders, source[0], len(meta[0][0]))
        orders[node.name] = order
        extra: dict[str, object] = {"order": order} if order else {}  # recorded even when the default: read
        extra.update({"input_orders": input_orders} if any(o != default_order(len(s)) for o, s in
                                                          zip(input_orders, shapes)) else {})
        return replace(info, attrs={**info.attrs, **extra}) if extra else info
    if len(meta) > 1:  # a tuple of tensors: the pieces of a cut keep the order of the value cut
        order = piece_order(info.attrs, source, [piece[0] for piece in meta])
        if info.kind == "other" and source and "n" not in source[0]:  # an opaque call on merged samples (an LSTM)
            order = "." * len(meta[0][0])  # each piece's rank (an unbind's pieces lose the dimension cut)
        orders[node.name] = order
        extra = {"piece_order": order} if order else {}
        if order and any(o != default_order(len(s)) for o, s in zip(input_orders, shapes)):
            extra["input_orders"] = input_orders  # (unbind's pieces lose a dimension: the value cut's order)
        return replace(info, attrs={**info.attrs, **extra}) if extra else info
    shape = meta[0][0]
    held = [orders.get(name, "") for name, made in zip(inputs, shapes) if made and isinstance(made[0], list)]
    order = held[0] if info.kind == "getitem" and held and len(held[0]) == len(shape) else \
        output_order(node, info.kind, source or _unordered(shapes), shape)
    kinds = [graph.nodes[name].kind for name in inputs]
    if sequence_layer(info.kind, info.attrs, shape, list(zip(kinds, input_orders, shapes))):  # its length is w
        order = NCW
        input_orders = [NCW if len(s) == 3 and (o == NCW or k == "input") else o
                         for k, o, s in zip(kinds, input_orders, shapes)]
    untraced = _untraced_source(node, graph, orders) if not inputs else None
    if untraced is not None:  # the result of a call the trace did not shape (an LSTM's (out, (h, c))) on it
        order = unknown_order(*untraced, shape)
    orders[node.name] = order
    extra = {"order": order} if order != default_order(len(shape)) else {}
    if any(o != default_order(len(s)) for o, s in zip(input_orders, shapes)):
        extra["input_orders"] = input_orders
    return replace(info, attrs={**info.attrs, **extra}) if extra else info


def _untraced_source(node: Node, graph: LayerGraph, orders: dict[str, str]) -> tuple[str, list[int]] | None:
    """The order and shape of the first layer in a non-default order that ``node`` reads through calls the
    LayerGraph does not hold (``None``: none)."""
    seen, stack = set(), list(node.all_input_nodes)
    while stack:
        src = stack.pop()
        if src.name in seen:
            continue
        seen.add(src.name)
        if src.name not in graph:
            stack.extend(src.all_input_nodes)
            continue
        shape = graph.nodes[src.name].output_shape
        order = orders.get(src.name, default_order(len(shape)))
        if order != default_order(len(shape)) and all(isinstance(extent, int) for extent in shape):
            return order, shape
    return None


def _stacked_or_reduced(attrs: dict[str, Any], input_orders: list[str], order: str, rank: int) -> str:
    if "stack_dim" in attrs:
        return stacked(order, attrs["stack_dim"], rank) if len(set(input_orders)) == 1 else ""
    made = reduced(order, attrs["reduces"], bool(attrs["keepdim"]))
    return made if len(made) == rank else ""


def _function_conv_attrs(graph: LayerGraph, weight: str) -> dict[str, Any]:
    """``F.conv2d(x, w, …)`` whose filters ``w`` a layer computes (a weight standardisation): their kernel size, and
    whether they are computed from the batch (a dynamic convolution, split by sample only)."""
    shape = graph.nodes[weight].output_shape
    if len(shape) != 4 or isinstance(shape[0], list):
        return {}
    from_batch = any(graph.nodes[name].kind == "input" for name in nx.ancestors(graph, weight) | {weight})
    return {"kernel_size": list(shape[2:]), "weight_from_batch": from_batch}


def record_pads(graph: LayerGraph, pads: dict[str, list[int]]) -> None:
    """``F.pad`` amounts computed from shapes (timm's ``pad_same``) as the traced call received them: the unsplit
    program's, which the runtime's distributed padding and the capability predicate read (``attrs["pad"]``)."""
    computed = {name: amounts for name, amounts in pads.items()
                if name in graph and "pad" not in graph.nodes[name].attrs}
    for name, amounts in computed.items():
        graph.replace_layer(name, attrs={**graph.nodes[name].attrs, "pad": amounts, "pad_from_shapes": True})
    if computed:
        graph.graph["fingerprint"] = compute_fingerprint(graph)


def record_output_dtypes(graph: LayerGraph, dtypes: dict[str, str]) -> None:
    """Each layer whose output is not a real floating value — complex, integer or boolean: its dtype
    (``attrs["output_dtype"]``), which a pipeline receives it in (the activations' dtype would be another byte
    count: half a complex value's; an ``int64`` index twice a float32's, and gloo aborts the receiving rank)."""
    other = {name: dtype for name, dtype in dtypes.items() if name in graph and not dtype.startswith(_REAL)}
    for name, dtype in other.items():
        graph.replace_layer(name, attrs={**graph.nodes[name].attrs, "output_dtype": dtype})
    if other:
        graph.graph["fingerprint"] = compute_fingerprint(graph)


_REAL = ("float", "bfloat", "half")


def record_amp(graph: LayerGraph, amp: str, dtypes: dict[str, str]) -> None:
    """Under ``amp``: each layer's compute dtype where it differs from the weights' (``dtype``), and ``amp``."""
    graph.graph["amp"] = AMP_DTYPES[amp]
    for name in graph.nodes:
        if dtypes.get(name, graph.graph["dtype"]) != graph.graph["dtype"]:
            graph.replace_layer(name, dtype=dtypes[name])
    graph.graph["fingerprint"] = compute_fingerprint(graph)
