"""The vocabulary of layer kinds that more than one room reads, free of torch.

``cost_models.ir.classify`` names each traced layer's kind; the families
below are the kinds the cost models, the capability predicate and the
runtime treat alike.
"""

from __future__ import annotations

__all__ = ["DENSE_KINDS", "VIEW_KINDS"]

DENSE_KINDS = frozenset({"conv", "conv_transpose", "linear"})
"""Layers with filters: a channel split divides their filters, and their input is read whole along the channels."""

VIEW_KINDS = frozenset({"flatten", "view", "getitem", "identity"})
"""Layers whose output is a view of their input: they compute nothing and pose no local problem."""
