"""The capability predicate's rules for views, permutations and orders (``cost_models.capability.predicate`` documents
them): which splits a view keeps, channels-last values (``cost_models.ir.orders``), a split by sample."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from cost_models.capability.registry import CHANNEL_RULES
from cost_models.ir.layer import Layer
from cost_models.ir.orders import KEEPING_KINDS, NCDHW, NCHW, NCW, default_order, reshaped
from cost_models.layout import Layout
from cost_models.redistribution import part_range

__all__ = ["channel_view_refusal", "last_dim_refusal", "on_last_dims", "order_refusal", "permutes",
           "reduction_refusal", "reshape_refusal", "sample_dim_refusal", "sample_view_refusal", "stacks_or_reduces"]

_CHANNEL_VIEWS = frozenset({"Tensor.view", "Tensor.reshape", "torch.reshape", "Tensor.contiguous"})


_WHOLE_RESHAPES = frozenset({"Tensor.view", "Tensor.reshape", "torch.reshape", "Tensor.unflatten"})
"""Reshapes with their sizes written (``runtime.shapes.view_form``) the runtime makes whole and cuts."""

_PERMUTATIONS = frozenset({"Tensor.permute", "Tensor.transpose", "Tensor.swapaxes", "Tensor.swapdims",
                           "Tensor.movedim", "Tensor.moveaxis", "torch.permute", "torch.transpose", "torch.swapaxes",
                           "torch.swapdims", "torch.movedim", "torch.moveaxis"})


def order_refusal(layer: Layer, layout: Layout) -> str | None:
    """A layer reading a value in another order than its rank's default (``cost_models.ir.orders``: channels-last, or a
    channel shuffle's 5-D view) splits it by channel or space only when it permutes or reshapes it, or computes
    per element or along the last dimension, or concatenates, every such input in one order."""
    orders = layer.attrs.get("input_orders")
    unsampled = sorted({order for order in orders or [] if order and "n" not in order})
    if layout.n > 1 and unsampled:  # dimension 0 merges the samples with more (B·heads): held whole, not split
        return (f"it reads a value in the order {unsampled[0]}, which holds no sample axis to split under {layout}; "
                f"split it by space or channel only")
    if not orders or layout.c * layout.spatial == 1:
        return None
    if layer.kind == "window_attention" or layer.attrs.get("patch_merging"):
        return None  # Swin's: their own rules (cost_models.capability.windows)
    ordered = {order for order in orders if order}
    if layer.kind == "cat" and "" in orders:
        return (f"it concatenates values in the order {'/'.join(sorted(ordered))} with one whose axes are not named "
                f"(a class token), which it reads whole under {layout}; split it by sample only")
    own = layer.attrs.get("order")
    if own in (NCW, NCDHW) and ordered == {own}:
        return None  # a sequence (volume) read by a layer computing on them: the rules of its kind decide
    if layer.kind == "view" or identity_item(layer) or (len(ordered) == 1 and (
            layer.kind in KEEPING_KINDS | {"cat", "attention"}
                                                          or stacks_or_reduces(layer))):
        return None  # a view's own rules (permutes, reshape_refusal) decide
    return (f"it reads values in the orders {'/'.join(sorted(ordered))} (channels-last, or a channel shuffle's) and "
            f"has no form for them under {layout}; split it by sample only")


def identity_item(layer: Layer) -> bool:
    """``out`` of attention's ``(out, None)``: an item of the shape of what it reads, that value itself."""
    return layer.kind == "getitem" and [list(shape) for shape in layer.input_shapes] == [
        list(layer.output_shape)]


def stacks_or_reduces(layer: Layer) -> bool:
    """``torch.stack`` or a reduction (``x.sum(1)``) whose output has an order (``cost_models.ir.orders``)."""
    attrs = layer.attrs
    return layer.kind == "other" and ("stack_dim" in attrs or "reduces" in attrs) and bool(attrs.get("order"))


def reduction_refusal(layer: Layer, layout: Layout) -> str | None:
    """A stack computes on every box what it computes on the whole; a reduction too when no dimension it reduces
    holds an axis the layout splits."""
    attrs, shape = layer.attrs, layer.input_shapes[0]
    if "reduces" not in attrs:
        return None
    order = _input_order(layer) or "n" + "c" * (len(shape) - 1)
    split = sorted({order[dim % len(order)] for dim in attrs["reduces"]
                    if getattr(layout, order[dim % len(order)], 1) > 1})
    if split:
        return f"it reduces dimensions holding the {'/'.join(split)} axis {layout} splits"
    missing = [axis for axis in "nchw" if getattr(layout, axis) > 1 and axis not in order]
    return (f"its input {tuple(shape)} ({order}) holds no {'/'.join(missing)} axis for {layout} to split"
            if missing else None)


def permutes(layer: Layer) -> bool:
    """A permutation of an ordered value (every 4-D value is): a permuted box under any layout."""
    inputs = layer.input_shapes
    if layer.kind != "view" or layer.target not in _PERMUTATIONS or not inputs:
        return False
    order = _input_order(layer)
    return len(layer.output_shape) == len(inputs[0]) and len(order) == len(inputs[0])


def reshape_refusal(layer: Layer, layout: Layout) -> str | None:
    """A reshape (a view with sizes, ``contiguous``) of a value split by rows or columns runs on the box when its
    value keeps every split axis in a dimension of the same extent (the leading and trailing dimensions it keeps:
    ``cost_models.ir.orders.reshaped``) — or when its value holds no rows (tokens, SwiftFormer's ``(N, C, H·W)``
    back to ``(N, C, H, W)``): every rank reads that value whole along its tokens (``w``) and cuts its box of the
    map."""
    source, target = layer.input_shapes[0], layer.output_shape
    read = _input_order(layer)
    if (layer.target in _WHOLE_RESHAPES and not {"d", "h"} & set(read)
            and {"h", "w"} & set(layer.attrs.get("order") or default_order(len(target)))):
        return None  # tokens (no rows): every rank reads them whole along w, reshapes them and cuts its box
    made = layer.attrs.get("order") or (reshaped(read, source, target) if read else None) or ""
    for axis in (a for a in "hw" if getattr(layout, a) > 1):
        if axis in read and source[read.index(axis)] < getattr(layout, axis):
            name = "rows" if axis == "h" else "columns"
            return f"its input {tuple(source)} has only {source[read.index(axis)]} {name} for {layout}"
        if axis not in read or axis not in made or source[read.index(axis)] != target[made.index(axis)]:
            return (f"a view from {tuple(source)} to {tuple(target)} ({layer.target}) moves the split "
                    f"{'rows' if axis == 'h' else 'columns'}")
    return None


def _input_order(layer: Layer) -> str:
    inputs = layer.input_shapes
    orders = layer.attrs.get("input_orders")
    return orders[0] if orders else default_order(len(inputs[0]) if inputs else 0)


def last_dim_refusal(layer: Layer, layout: Layout) -> str | None:
    """A LayerNorm (over its last dimensions), or a linear layer on a channels-last value: each position computes
    alone, on a box holding the dimensions it reads whole; ``None`` when the layout splits none of them — or, for
    an ``nn.Linear`` module on a 4-D value or on tokens, only its channels: it splits its filters, reading its
    input whole along them."""
    attrs, shape = layer.attrs, layer.input_shapes[0]
    count = len(attrs.get("normalized_shape") or [0]) if layer.kind == "norm" else 1
    order = (attrs.get("input_orders") or [""])[0]
    if len(order) != len(shape):  # no order of its own: nchw when 4-D, else features (c) after the samples
        order = NCHW if len(shape) == 4 else "n" + "c" * (len(shape) - 1)
    split = sorted({axis for axis in order[len(shape) - count:] if getattr(layout, axis, 1) > 1})
    if layer.kind == "linear" and split == ["c"] and len(shape) in (3, 4):
        if attrs.get("function_form"):
            return "linear is a function call; only its module form (nn.Linear) splits its filters"
        split = []  # its filters split, its input read whole along the channels (as a convolution's)
    if split:
        what = "a LayerNorm normalises over" if layer.kind == "norm" else "a linear layer reads"
        return f"{what} its last {count} dimension(s), which hold the {'/'.join(split)} axis {layout} splits"
    return sample_dim_refusal(layer) if layout.n > 1 else None


def on_last_dims(layer: Layer) -> bool:
    """A LayerNorm, or a linear layer reading a 4-D value, or 3-D tokens, that holds its channels last."""
    attrs, inputs = layer.attrs, layer.input_shapes
    if layer.kind == "norm":
        return attrs.get("norm") == "LayerNorm"
    return (layer.kind == "linear" and bool(inputs) and len(inputs[0]) in (3, 4)
            and (attrs.get("input_orders") or [NCHW])[0].endswith("c"))


@CHANNEL_RULES.register("view")
def channel_view_refusal(layer: Layer, layout: Layout) -> str | None:
    """A view keeps a channel split only when it keeps the channels where they are, or flattens them first."""
    if not layer.input_shapes:
        return "a view of a parameter or constant is kept whole"
    (source, *_), target = layer.input_shapes, layer.output_shape
    same = list(source) == list(target)
    if not same and _input_order(layer) != default_order(len(source)):
        return (f"a view of a {_input_order(layer)} value from {tuple(source)} to {tuple(target)} moves the split "
                f"channels")
    flattened = len(target) == 2 and len(source) >= 2 and target[0] == source[0]
    if not (same or flattened) or layer.target not in _CHANNEL_VIEWS:
        return f"a view from {tuple(source)} to {tuple(target)} ({layer.target}) moves the split channels"
    if source[1] % layout.c:
        return f"{source[1]} channels do not split evenly into {layout.c} parts"
    return None


def sample_view_refusal(layer: Layer, layout: Layout) -> str | None:
    """A view runs on this rank's samples: exact when its part of the output is the same samples' elements.

    A permutation must keep dimension 0 (the samples); a reshape must map each part of the samples onto the
    same part of its output's dimension 0 (``(N, T, D) → (N·T, D)`` does; ``(N, T, D) → (T, N·D)`` does not).
    """
    if not layer.input_shapes or not layer.input_shapes[0] or isinstance(layer.input_shapes[0][0], list):
        return None  # a view of parameters or constants: the runtime computes it whole
    if not layer.output_shape:
        return "a view to a 0-D tensor takes no split along dimension 0"
    source, target = layer.input_shapes[0], layer.output_shape
    if any(1 < extent < layout.n for extent in (source[0], target[0])):
        return f"its input {tuple(source)} has fewer elements than the {layout} parts along dimension 0"
    if layer.target in _PERMUTATIONS:
        return None if source[0] == target[0] else (
            f"a permutation from {tuple(source)} to {tuple(target)} moves the split samples out of dimension 0")
    per_in, per_out = _numel(source[1:]), _numel(target[1:])
    for part in range(layout.n):
        if [e * per_in for e in _part(source[0], layout.n, part)] != [e * per_out for e in
                                                                     _part(target[0], layout.n, part)]:
            return (f"a view from {tuple(source)} to {tuple(target)} moves the split samples: part {part} of the "
                    f"input's samples is not part {part} of the output's first dimension")
    return None


def sample_dim_refusal(layer: Layer) -> str | None:
    """Under a sample split a layer runs on its own samples: each tensor it reads holds them in dimension 0, as
    its output does (or broadcasts one sample): every operand of an opaque call (``q @ k.T`` mixes samples when
    ``k.T`` holds them in dimension 1), the first of any other layer (later ones may be its parameters).
    ``qkv[0]`` of a ``(3, N, …)`` stack, a reduction over the batch, a padding of dimension 0 do not, nor does
    ``torch.stack(…, dim=0)`` (its dimension 0 counts the stacked tensors, whatever its extent)."""
    target, sources = layer.output_shape, layer.input_shapes
    if layer.attrs.get("selects_samples"):
        return ("it writes into, or views, a part of a value that may index or move dimension 0 (the samples), "
                "which a sample split holds on other ranks")
    stacked, reduced = layer.attrs.get("stack_dim"), layer.attrs.get("reduces", [])
    if stacked is not None and stacked % len(target) == 0:
        return "it stacks its inputs along a new dimension 0, ahead of the samples (efficientvim's heads)"
    if sources and isinstance(sources[0], list) and sources[0] and not isinstance(sources[0][0], list) and any(
            dim % len(sources[0]) == 0 for dim in reduced):
        return "it reduces dimension 0 of its input, which holds the samples under a sample split"
    if layer.target in _MATMULS and len(sources) > 1 and isinstance(sources[1], list) and \
            len(sources[1]) == 2 and sources[1][0] == target[0] and len(target) == 2:
        return ("it multiplies by a 2-D value whose rows are the samples, summing over the batch (csatv2's "
                "attention of (B, N) by (B, N)ᵀ by (B, N))")
    read = sources if layer.kind in ("other", "attention") else sources[:1]  # all operands are activations
    for source in read:
        if isinstance(source, list) and source and not isinstance(source[0], list) and source[0] not in (
                1, target[0]):
            return (f"it maps dimension 0 of its input {tuple(source)} onto dimension 0 of its output "
                    f"{tuple(target)}, which moves the split samples")
    return None


_MATMULS = frozenset({"_operator.matmul", "torch.matmul", "Tensor.matmul", "torch.mm", "Tensor.mm"})


def _part(extent: int, parts: int, index: int) -> tuple[int, int]:
    return (0, extent) if extent == 1 else part_range(extent, parts, index)


def _numel(shape: Sequence[int]) -> int:
    return prod(int(extent) for extent in shape)
