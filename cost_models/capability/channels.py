"""The capability predicate's rules for channel splits (``c > 1``; ``cost_models.capability.predicate``
documents them), each registered for its kind in ``CHANNEL_RULES``: grouped convolutions split by whole groups,
flattening and softmax keep the split channels apart, padding leaves the channel dimension alone. Views',
group-norm's and pixel shuffles' channel rules live with their families (``views``, ``spatial``)."""

from __future__ import annotations

from cost_models.capability.registry import CHANNEL_RULES
from cost_models.ir.layer import Layer
from cost_models.layout import Layout

__all__: list[str] = []


@CHANNEL_RULES.register("conv")
def _grouped_refusal(layer: Layer, layout: Layout) -> str | None:
    attrs = layer.attrs
    if attrs.get("groups", 1) > 1:
        groups, filters = attrs["groups"], layer.output_shape[1]
        if groups % layout.c or filters % layout.c:
            return f"{groups} groups and {filters} filters do not split evenly into {layout.c} channel parts"
    return None


@CHANNEL_RULES.register("conv_transpose")
def _transposed_refusal(layer: Layer, layout: Layout) -> str | None:
    if layer.attrs.get("groups", 1) > 1:
        return "a grouped transposed convolution cannot be split by channel"
    return None


@CHANNEL_RULES.register("flatten")
def _flatten_refusal(layer: Layer, layout: Layout) -> str | None:
    if layer.input_shapes[0][1] % layout.c:
        return f"{layer.input_shapes[0][1]} channels do not split evenly into {layout.c} parts"
    return None


@CHANNEL_RULES.register("softmax")
def _softmax_refusal(layer: Layer, layout: Layout) -> str | None:
    if layer.attrs.get("dim") in ((1, -1) if len(layer.output_shape) == 2 else (1, -3)):
        return "softmax over the split channel dimension"
    return None


@CHANNEL_RULES.register("pad")
def _pad_refusal(layer: Layer, layout: Layout) -> str | None:
    if "pad" not in layer.attrs:
        return "a padding computed from tensor shapes may pad the split channel dimension"
    if _pads_dimension(layer.attrs["pad"], len(layer.output_shape), 1):
        return "padding along the split channel dimension moves the split channels"
    return None


def _pads_dimension(pad: object, rank: int, dim: int) -> bool:
    """Whether ``F.pad``'s ``pad`` (last dimension first: left, right, top, bottom, …) pads dimension ``dim``."""
    if not isinstance(pad, (list, tuple)):
        return False
    first = 2 * (rank - 1 - dim)
    return any(not isinstance(v, (int, float)) or v != 0 for v in pad[first:first + 2])  # unknown: it may
