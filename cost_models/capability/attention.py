"""The capability predicate's rules for attention (kind ``attention``; ``cost_models.capability.predicate``
documents them).

``nn.MultiheadAttention`` and ``F.scaled_dot_product_attention`` split by
sample where the query holds the samples in dimension 0. The module attending
to itself (one input, no mask, no dropout, on tokens ``nwc``) splits by token
(``w``: ``runtime.layers``) and by whole heads (``c``: ``runtime.attention``);
the function splits by token where its query, keys and values ``(N, H, L, D)``
name them (``w`` in dimension 2).
"""

from __future__ import annotations

from cost_models.ir.layer import Layer
from cost_models.layout import Layout

__all__ = ["attention_refusal"]


def attention_refusal(layer: Layer, layout: Layout) -> str | None:
    """Why the runtime cannot run the attention ``layer`` under ``layout`` (``None``: it can)."""
    if layout.n > 1 and (why := _samples_refusal(layer)):
        return why
    return _split_refusal(layer, layout) if layout.c * layout.spatial > 1 else None


def _samples_refusal(layer: Layer) -> str | None:
    """Attention splits by sample only where dimension 0 of its query holds the samples."""
    attrs, query = layer.attrs, (layer.input_shapes or [[]])[0]
    if len(query) < 3:
        return f"its query {tuple(query)} is unbatched: it has no samples to split"
    if attrs.get("form") == "module" and not attrs.get("batch_first"):
        return ("nn.MultiheadAttention(batch_first=False) holds the samples in dimension 1; construct it with "
                "batch_first=True to split it by sample")
    return None


def _split_refusal(layer: Layer, layout: Layout) -> str | None:
    """Attention splits its tokens (``w``: each rank's queries attend to every token, its keys and values read
    whole) and heads (``c``: ``runtime.attention``) as an ``nn.MultiheadAttention`` module attending to itself
    without a mask or dropout, on tokens ``nwc``."""
    attrs, inputs = layer.attrs, layer.input_shapes
    if attrs.get("form") != "module":
        return _fused_refusal(layer, layout)
    if len(inputs) != 1 or attrs.get("masked") or attrs.get("dropout"):
        return "attention to other tensors, under a mask or with dropout splits by sample only"
    if layout.h > 1 or layout.d > 1:
        return f"attention splits its samples, heads (c) and tokens (t, the w axis) only, not {layout}"
    if (attrs.get("input_orders") or [""])[0] != "nwc" or attrs.get("order") != "nwc":
        return "attention splits tokens held (N, L, E) (order nwc) only"
    heads = int(attrs.get("num_heads", 1))
    if layout.c > 1 and (heads % layout.c or attrs.get("extra_keys")):
        return (f"attention splits whole heads: {heads} heads into {layout.c} parts"
                if heads % layout.c else "attention with added key/value biases or zero attention splits no heads")
    return None


def _fused_refusal(layer: Layer, layout: Layout) -> str | None:
    """``F.scaled_dot_product_attention(q, k, v)`` splits its tokens (``w``): queries, keys and values ``(N, H,
    L, D)`` holding them on one axis named ``w`` (timm's ``qkv.unbind(0)`` of tokens ``nwc``), no mask, no
    dropout; each rank's queries attend to every key and value (read whole along ``w``). Its heads are no
    named axis: not split."""
    attrs, order = layer.attrs, layer.attrs.get("order") or ""
    if layout.c > 1 or layout.h > 1 or layout.d > 1:
        return f"scaled_dot_product_attention splits its samples and tokens (t, the w axis) only, not {layout}"
    if attrs.get("masked") or attrs.get("dropout_p"):
        return "scaled_dot_product_attention under a mask or with dropout splits by sample only"
    if len(order) != 4 or order[2] != "w" or (attrs.get("input_orders") or []) != [order] * 3:
        return ("scaled_dot_product_attention splits tokens only where its query, keys and values (N, H, L, D) "
                "name them (w, dimension 2)")
    return None
