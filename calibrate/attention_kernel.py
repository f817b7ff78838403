"""Timing attention: ``nn.MultiheadAttention`` (its projections and the attention between them) and
``F.scaled_dot_product_attention`` on a local problem's shapes (``calibrate.kernels``).

Forward runs the call; backward is the autograd backward of that one call, to the inputs and (the module's)
weights — what training runs. Dropout is off: a timing measures the kernels, not the random draws.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cost_models.local_problem import LocalProblem

__all__ = ["attention_kernel"]


def attention_kernel(problem: LocalProblem, phase: str, inputs: list[torch.Tensor]) -> Callable[[], object]:
    """A callable running ``phase`` (``fwd`` or ``bwd``) of the attention ``problem`` on ``inputs``."""
    attrs = dict(problem.attrs)
    query = inputs[0]
    key = inputs[1] if len(inputs) > 1 else query  # self-attention reads one tensor three times
    value = inputs[2] if len(inputs) > 2 else key
    forward, weights = _attention_call(attrs, query)
    if phase == "fwd":
        return lambda: forward(query, key, value)
    leaves = [x.requires_grad_() for x in dict.fromkeys([query, key, value])]
    output = forward(query, key, value)
    grad_output = torch.randn_like(output)
    wrt = [*leaves, *weights]
    return lambda: torch.autograd.grad(output, wrt, grad_output, retain_graph=True)


def _attention_call(attrs: dict[str, Any],
                    like: torch.Tensor) -> tuple[Callable[..., torch.Tensor], list[torch.Tensor]]:
    """The forward of the attention ``attrs`` describe, on ``like``'s device and dtype, and its weights."""
    if attrs.get("form") == "module":
        module = nn.MultiheadAttention(int(attrs["embed_dim"]), int(attrs["num_heads"]), kdim=attrs.get("kdim"),
                                       vdim=attrs.get("vdim"), batch_first=bool(attrs.get("batch_first")),
                                       device=like.device, dtype=like.dtype)
        return (lambda q, k, v: module(q, k, v, need_weights=False)[0]), list(module.parameters())
    causal, scale = bool(attrs.get("is_causal")), attrs.get("scale")
    return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)), []
