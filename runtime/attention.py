"""Self-attention split by heads: this rank's heads attend, their outputs are gathered, the output projection
computes this rank's channels.

``nn.MultiheadAttention`` of ``H`` heads over ``E`` features, split ``c`` ways
(``H`` a multiple of ``c``): channel part ``k`` (``partition(E, c)[k]``, whole
heads) projects the queries, keys and values of its heads from the input read
whole along the channels (rows ``k`` of each of the three blocks of
``in_proj_weight``), attends (``F.scaled_dot_product_attention``, the
module's own kernel), gathers every head's output across the ``c`` group
(an all-gather; its adjoint a reduce-scatter of the gradients) and applies
the rows ``k`` of ``out_proj`` — its output is part ``k`` of the channels,
as a column-split linear layer's. The weights stay whole on every rank (each
rank's gradient covers its rows, zero elsewhere; the sum over the ranks, as
every whole parameter's, is the unsplit gradient). Under a token split
(``w``) too, the queries are this rank's tokens and the keys and values every
token (``runtime.layers``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from cost_models.halo import partition
from cost_models.layout import Layout
from cost_models.redistribution import coordinates
from runtime._values import from4d, geometry, in_geometry
from runtime.placement import Placement
from runtime.redistribute import redistribute

__all__ = ["heads_attention"]


def heads_attention(module: nn.MultiheadAttention, queries: torch.Tensor, every: torch.Tensor, layout: Layout,
                    member: int, ranks: Sequence[int], shape: Sequence[int]) -> torch.Tensor:
    """This rank's box of the attention's output of global ``shape`` (tokens ``(N, L, E)``, order ``nwc``)."""
    embed, heads = module.embed_dim, module.num_heads
    start, stop = partition(embed, layout.c)[coordinates(layout, member)[1]]
    weight, bias = module.in_proj_weight, module.in_proj_bias

    def projected(x: torch.Tensor, block: int) -> torch.Tensor:
        rows = slice(block * embed + start, block * embed + stop)
        local = F.linear(x, weight[rows], None if bias is None else bias[rows])
        return local.unflatten(-1, (heads // layout.c, embed // heads)).transpose(1, 2)

    attended = F.scaled_dot_product_attention(projected(queries, 0), projected(every, 1), projected(every, 2))
    mine = attended.transpose(1, 2).flatten(2)  # (N, L_q, E/c): part k of the channels
    gathered = _gathered(mine, layout, member, ranks, shape)
    out = module.out_proj
    return F.linear(gathered, out.weight[start:stop], None if out.bias is None else out.bias[start:stop])


def _gathered(mine: torch.Tensor, layout: Layout, member: int, ranks: Sequence[int],
              shape: Sequence[int]) -> torch.Tensor:
    """``mine`` (this rank's channel part of a value of ``shape`` in ``layout``) whole along the channels."""
    have, want = Placement(layout, order="nwc"), Placement(layout, "c", order="nwc")
    cut = geometry(shape, have)
    moved = redistribute(in_geometry(mine, shape, have), cut, have, want, ranks)
    return moved if want.holds(shape) else from4d(moved, shape, want.box(cut, member))
