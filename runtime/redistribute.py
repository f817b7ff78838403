"""Moving a 4-D tensor from one placement to another across the ranks of a group, as an autograd function.

Placements are :class:`runtime.placement.Placement` (a Layout is the
placement of its own grid, ``cost_models.redistribution.rank_box``). Members
whose source boxes are equal hold copies; a member receives each element it
lacks from one holder of the source box that has it — the holder in its own
replica block, as the cost model assumes (holder number ``⌊q·copies/G⌋`` for
member ``q`` of ``G``). Every message is one contiguous sub-box, sent with
non-blocking point-to-point operations (all posted, then waited), so it works
on gloo, NCCL and MPI alike.

Backward is the adjoint: each received block's gradient goes back to the
rank that sent it and is added to that rank's input gradient. Copies'
gradients are not summed here: each copy gets the gradient of the elements
it sent (and kept), so the sum over the copies is the unsplit gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Protocol

import torch
import torch.distributed as dist

from cost_models.layout import Layout
from cost_models.redistribution import Box
from runtime.placement import Placement, as_placement, box_extent, box_view, intersect
from runtime.waiting import exchange, in_backward, place

__all__ = ["redistribute", "replicated"]

Moves = tuple[tuple[tuple[int, Box], ...], tuple[tuple[int, Box], ...]]


def redistribute(local: torch.Tensor, shape: Sequence[int], source: Layout | Placement,
                 target: Layout | Placement, ranks: Sequence[int]) -> torch.Tensor:
    """This rank's box of the tensor under ``target``, from its box ``local`` under ``source``.

    Args:
        local: The box ``source.box(shape, q)`` of this rank (member ``q`` of ``ranks``).
        shape: The global 4-D shape.
        ranks: Global ranks of the group, in placement order; every member must call this.

    Raises:
        ValueError: This rank is not in ``ranks``, a layout's rank count does not divide the group,
            or ``local`` has the wrong shape.
    """
    return _Redistribute.apply(local, tuple(shape), as_placement(source), as_placement(target), tuple(ranks))


def replicated(local: torch.Tensor, whole: Callable[[torch.Tensor], torch.Tensor], geometry: tuple[int, ...],
               box: Box, copies: int) -> torch.Tensor:
    """``whole(local)`` — the whole value on every rank, from this rank's box ``local`` of it — with the adjoint
    of a replicated value (PyTorch's DTensor ``Shard → Replicate``).

    Every rank is assumed to compute the same function of the whole value (a loss, as the unsplit model
    computes it), so every rank's gradient of it is the whole gradient: each rank keeps its own box of it
    (``box`` of ``geometry``, the shape the placement cuts) — no sum over the ranks, which would count the
    gradient once per rank — divided among the ``copies`` members that hold the same box (their gradients are
    summed later, as every copy's are). Nothing moves in the backward pass.
    """
    return _Replicated.apply(local, whole, geometry, box, copies)


class _ReplicatedContext(Protocol):
    geometry: tuple[int, ...]
    box: Box
    copies: int
    local_shape: torch.Size


class _Replicated(torch.autograd.Function):
    @staticmethod
    def forward(ctx: _ReplicatedContext, local: torch.Tensor, whole: Callable[[torch.Tensor], torch.Tensor],
                geometry: tuple[int, ...], box: Box, copies: int) -> torch.Tensor:
        ctx.geometry, ctx.box, ctx.copies, ctx.local_shape = geometry, box, copies, local.shape
        result = whole(local)
        return local.view_as(local) if result is local else result

    @staticmethod
    def backward(ctx: _ReplicatedContext, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        full = tuple((0, extent) for extent in ctx.geometry)
        own = box_view(grad.reshape(ctx.geometry), full, ctx.box).reshape(ctx.local_shape)
        return own / ctx.copies if ctx.copies > 1 else own.contiguous(), None, None, None, None


class _MoveContext(Protocol):
    moves: Moves
    source: Placement
    target: Placement
    held: Box
    wanted: Box
    where: tuple[str, ...]


class _Redistribute(torch.autograd.Function):
    @staticmethod
    def forward(ctx: _MoveContext, local: torch.Tensor, shape: tuple[int, ...], source: Placement, target: Placement,
                ranks: tuple[int, ...]) -> torch.Tensor:
        me = _member(ranks)
        for placement in (source, target):
            if len(ranks) % placement.layout.ranks:
                raise ValueError(f"layout {placement.layout} ({placement.layout.ranks} ranks) does not divide a group "
                                 f"of {len(ranks)}")
        held = source.box(shape, me)
        if tuple(local.shape) != box_extent(held):
            raise ValueError(f"rank {ranks[me]} holds {tuple(local.shape)} but {source} gives it {box_extent(held)}")
        ctx.moves = moves(shape, source, target, ranks, me)
        ctx.source, ctx.target = source, target
        ctx.held, ctx.wanted, ctx.where = held, target.box(shape, me), place()
        return _exchange(local, held, ctx.wanted, ctx.moves, _what(source, target), ctx.where)

    @staticmethod
    def backward(ctx: _MoveContext, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        sends, receives = ctx.moves  # the adjoint: what came in goes back, what went out comes back
        result = _exchange(grad.contiguous(), ctx.wanted, ctx.held, (receives, sends),
                           _what(ctx.target, ctx.source), in_backward(ctx.where))
        return result, None, None, None, None


@lru_cache(maxsize=4096)
def moves(shape: tuple[int, ...], source: Placement, target: Placement, ranks: tuple[int, ...], me: int) -> Moves:
    """``(sends, receives)`` of member ``me``: per peer (global rank) the box of the global index space that moves."""
    size = len(ranks)
    held_by = [source.box(shape, q) for q in range(size)]
    holders: dict[Box, list[int]] = {}
    for q, box in enumerate(held_by):
        holders.setdefault(box, []).append(q)
    wanted = target.box(shape, me)
    receives = []
    for box, owners in holders.items():
        piece = intersect(box, wanted)
        if piece is not None and box != held_by[me]:
            receives.append((ranks[owners[me * len(owners) // size]], piece))
    sends = []
    mine = holders[held_by[me]]
    for peer in range(size):
        if held_by[peer] == held_by[me] or mine[peer * len(mine) // size] != me:
            continue
        piece = intersect(held_by[me], target.box(shape, peer))
        if piece is not None:
            sends.append((ranks[peer], piece))
    return tuple(sends), tuple(receives)


def _exchange(data: torch.Tensor, have: Box, want: Box, pieces: Moves, what: str, where: Sequence[str]) -> torch.Tensor:
    """Send sub-boxes of ``data`` (which covers ``have``), receive into a result covering ``want``.

    The result starts at zero and pieces are added, so pieces that cover the
    same element (gradients of copies, backward) are summed.
    """
    sends, receives = pieces
    result = data.new_zeros(box_extent(want))
    own = intersect(have, want)
    if own is not None:
        box_view(result, want, own).add_(box_view(data, have, own))
    buffers = [(box, data.new_empty(box_extent(box))) for _, box in receives]
    with exchange(what, [peer for peer, _ in sends + receives], where):  # posting fails too when a peer is gone
        requests = [dist.isend(box_view(data, have, box).contiguous(), peer) for peer, box in sends]
        requests += [dist.irecv(buffer, peer) for (peer, _), (_, buffer) in zip(receives, buffers)]
        for request in requests:
            assert request is not None  # None only to a rank outside the default group
            request.wait()
    for box, buffer in buffers:
        box_view(result, want, box).add_(buffer)  # the result starts at zero: adding is copying, or summing
    return result


def _what(source: Placement, target: Placement) -> str:
    return f"the redistribution {source.layout}→{target.layout}"


def _member(ranks: tuple[int, ...]) -> int:
    rank = dist.get_rank()
    if rank not in ranks:
        raise ValueError(f"rank {rank} is not in the redistribution group {list(ranks)}")
    return ranks.index(rank)
