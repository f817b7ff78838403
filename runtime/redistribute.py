"""Moving a 4-D tensor from one layout to another across the ranks of a group, as an autograd function.

Placement is the cost model's (``cost_models.redistribution``): group member
``q`` holds the box ``rank_box(shape, layout, q)``, members of a layout with
fewer ranks than the group hold copies, and a member receives each element it
lacks from the holder in its own replica block of the source layout. Every
message is one contiguous sub-box, sent with non-blocking point-to-point
operations (all posted, then waited), so it works on gloo, NCCL and MPI
alike.

Backward is the adjoint: each received block's gradient goes back to the
rank that sent it and is added to that rank's input gradient. When the
source layout has fewer ranks than the group (copies), the copies' gradients
are not summed here: each copy gets the gradient of the elements it sent.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from cost_models.layout import Layout
from cost_models.redistribution import Box, rank_box

__all__ = ["redistribute"]


def redistribute(local: torch.Tensor, shape: Sequence[int], source: Layout, target: Layout,
                 ranks: Sequence[int]) -> torch.Tensor:
    """This rank's box of the tensor under ``target``, from its box ``local`` under ``source``.

    Args:
        local: The box ``rank_box(shape, source, q)`` of this rank (member ``q`` of ``ranks``).
        shape: The global 4-D shape.
        ranks: Global ranks of the group, in placement order; every member must call this.

    Raises:
        ValueError: This rank is not in ``ranks``, a layout's rank count does not divide the group,
            or ``local`` has the wrong shape.
    """
    return _Redistribute.apply(local, tuple(shape), source, target, tuple(ranks))


class _Redistribute(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, shape: tuple[int, ...], source: Layout, target: Layout,
                ranks: tuple[int, ...]) -> torch.Tensor:
        me = _member(ranks)
        for layout in (source, target):
            if len(ranks) % layout.ranks:
                raise ValueError(f"layout {layout} ({layout.ranks} ranks) does not divide a group of {len(ranks)}")
        held = rank_box(shape, source, me)
        if tuple(local.shape) != _extent(held):
            raise ValueError(f"rank {ranks[me]} holds {tuple(local.shape)} but {source} gives it {_extent(held)}")
        ctx.moves = _moves(shape, source, target, ranks, me)
        ctx.held, ctx.wanted = held, rank_box(shape, target, me)
        return _exchange(local, held, ctx.wanted, ctx.moves)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        sends, receives = ctx.moves  # the adjoint: what came in goes back, what went out comes back
        return _exchange(grad.contiguous(), ctx.wanted, ctx.held, (receives, sends)), None, None, None, None


def _moves(shape: tuple[int, ...], source: Layout, target: Layout, ranks: tuple[int, ...],
           me: int) -> tuple[list[tuple[int, Box]], list[tuple[int, Box]]]:
    """``(sends, receives)``: per peer (global rank) the box of the global index space that moves."""
    block = me // source.ranks * source.ranks
    held = rank_box(shape, source, me)
    wanted = rank_box(shape, target, me)
    sends, receives = [], []
    for peer in range(len(ranks)):
        if peer == me:
            continue
        if peer // source.ranks * source.ranks == block:  # I am the holder for peer's wanted elements
            box = _intersect(held, rank_box(shape, target, peer))
            if box is not None:
                sends.append((ranks[peer], box))
        if block <= peer < block + source.ranks:  # peer holds part of what I want
            box = _intersect(rank_box(shape, source, peer), wanted)
            if box is not None and _intersect(box, held) is None:
                receives.append((ranks[peer], box))
    return sends, receives


def _exchange(data: torch.Tensor, have: Box, want: Box, moves: tuple[list[tuple[int, Box]], list[tuple[int, Box]]]) -> torch.Tensor:
    """Send sub-boxes of ``data`` (which covers ``have``), receive into a result covering ``want``.

    The result starts at zero and pieces are added, so pieces that cover the
    same element (gradients of copies, backward) are summed.
    """
    sends, receives = moves
    result = data.new_zeros(_extent(want))
    own = _intersect(have, want)
    if own is not None:
        _view(result, want, own).add_(_view(data, have, own))
    buffers = [(box, data.new_empty(_extent(box))) for _, box in receives]
    requests = [dist.isend(_view(data, have, box).contiguous(), peer) for peer, box in sends]
    requests += [dist.irecv(buffer, peer) for (peer, _), (_, buffer) in zip(receives, buffers)]
    for request in requests:
        request.wait()
    for box, buffer in buffers:
        _view(result, want, box).add_(buffer)  # the result starts at zero: adding is copying, or summing
    return result


def _member(ranks: tuple[int, ...]) -> int:
    rank = dist.get_rank()
    if rank not in ranks:
        raise ValueError(f"rank {rank} is not in the redistribution group {list(ranks)}")
    return ranks.index(rank)


def _intersect(a: Box, b: Box) -> Box | None:
    box = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b))
    return box if all(lo < hi for lo, hi in box) else None


def _extent(box: Box) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in box)


def _view(tensor: torch.Tensor, origin: Box, box: Box) -> torch.Tensor:
    view = tensor
    for dim, ((start, _), (lo, hi)) in enumerate(zip(origin, box)):
        view = view.narrow(dim, lo - start, hi - lo)
    return view
