"""The vocabulary of layer kinds, free of torch: every kind a traced layer may have, and the families of kinds
that more than one room treats alike.

``cost_models.ir.classify`` names each traced layer's kind from its fx node;
a kind outside :data:`LayerKind` is a bug there (``other`` is the kind of
what parplan has no split form of).
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["DENSE_KINDS", "KINDS", "VIEW_KINDS", "LayerKind"]

LayerKind = Literal[
    "input", "conv", "conv_transpose", "linear", "batchnorm", "norm", "maxpool", "avgpool", "adaptive_avgpool",
    "adaptive_maxpool", "upsample", "pad", "pixel_shuffle", "activation", "dropout", "identity", "add", "mul",
    "elementwise", "mean", "softmax", "cat", "flatten", "view", "getitem", "attention", "window_attention", "other",
]
"""What a traced layer computes: ``input`` for a model input, ``other`` for a call parplan has no split form of."""

KINDS: frozenset[str] = frozenset(get_args(LayerKind))
"""Every :data:`LayerKind`, as a set of names."""

DENSE_KINDS: frozenset[LayerKind] = frozenset({"conv", "conv_transpose", "linear"})
"""Layers with filters: a channel split divides their filters, and their input is read whole along the channels."""

VIEW_KINDS: frozenset[LayerKind] = frozenset({"flatten", "view", "getitem", "identity"})
"""Layers whose output is a view of their input: they compute nothing and pose no local problem."""
