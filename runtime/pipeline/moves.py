"""A value crossing a pipeline cut between stages of any device counts: which piece goes from whom to whom.

Stage ``k``'s ``G_k`` members hold a crossing value under its producer's
placement ``P``; a consuming stage of ``G_m`` members takes it under the wire
placement :func:`wire_placement` — ``P`` itself when ``P``'s grid divides
``G_m`` (equal stages: member ``q`` sends its box to member ``q``, nothing
cut), else ``P``'s grid reduced axis by axis (``n``, ``d``, ``h``, ``w``,
then ``c``) to a divisor of ``G_m``, so no box is smaller than the producer's
and none is empty. The consuming stage then redistributes it inside itself as
any other input (``runtime.redistribute``).

Consumer member ``j`` gets each element of its wire box from one holder of
the producer box that has it: of a box's ``c`` copies, holder number
``⌊j·c/G_m⌋`` (as ``runtime.redistribute`` spreads its readers). Every
message is one contiguous sub-box in the global index space. The backward is
the adjoint: each piece's gradient goes back to its sender, which adds it to
its box's gradient; a copy that sent nothing gets zero, so the sum over the
copies is the unsplit gradient (``runtime.redistribute``'s convention).

Boxes are cut in the value's geometry (``runtime._values.geometry``: its own
dimensions where its order names them, else flattened ``(N, features, 1, 1)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from math import gcd

from cost_models.layout import Layout
from cost_models.redistribution import Box
from runtime.placement import Placement, intersect

__all__ = ["CrossingMoves", "crossing_moves", "wire_placement"]

_REDUCE_ORDER = ("n", "d", "h", "w", "c")


@dataclass(frozen=True)
class CrossingMoves:
    """What this rank sends and receives of one crossing between two stages: ``(global peer, piece)`` pairs, each
    piece a box of the global index space; ``box`` is the box this rank holds (producer) or receives (consumer)."""

    box: Box
    sends: tuple[tuple[int, Box], ...]
    receives: tuple[tuple[int, Box], ...]


def wire_placement(source: Placement, consumers: int) -> Placement:
    """The placement a stage of ``consumers`` members receives a value held under ``source`` in (module docstring)."""
    if consumers % source.layout.ranks == 0:
        return source
    budget, parts = consumers, {}
    for axis in _REDUCE_ORDER:
        parts[axis] = gcd(getattr(source.layout, axis), budget)
        budget //= parts[axis]
    return replace(source, layout=Layout(**parts))


def crossing_moves(shape: Sequence[int], source: Placement, source_ranks: Sequence[int], target: Placement,
                   target_ranks: Sequence[int], rank: int) -> CrossingMoves:
    """The pieces ``rank`` sends (a member of ``source_ranks``) or receives (of ``target_ranks``) when the value of
    geometry ``shape`` moves from ``source`` over ``source_ranks`` to ``target`` over ``target_ranks``.

    Raises:
        ValueError: ``rank`` is in neither group, or a placement's grid does not divide its group.
    """
    for placement, ranks in ((source, source_ranks), (target, target_ranks)):
        if len(ranks) % placement.layout.ranks:
            raise ValueError(f"placement {placement} ({placement.layout.ranks} ranks) does not divide a stage of "
                             f"{len(ranks)}")
    plan = _pieces(tuple(shape), source, len(source_ranks), target, len(target_ranks))
    if rank in source_ranks:
        q = list(source_ranks).index(rank)
        return CrossingMoves(source.box(shape, q),
                             tuple((target_ranks[j], piece) for sender, j, piece in plan if sender == q), ())
    if rank in target_ranks:
        j = list(target_ranks).index(rank)
        return CrossingMoves(target.box(shape, j), (),
                             tuple((source_ranks[sender], piece) for sender, reader, piece in plan if reader == j))
    raise ValueError(f"rank {rank} is in neither stage of the crossing ({list(source_ranks)}, {list(target_ranks)})")


def _pieces(shape: tuple[int, ...], source: Placement, senders: int, target: Placement,
            readers: int) -> list[tuple[int, int, Box]]:
    """Every ``(sender member, reader member, piece)`` of the move."""
    holders: dict[Box, list[int]] = {}
    for q in range(senders):
        holders.setdefault(source.box(shape, q), []).append(q)
    found = []
    for j in range(readers):
        wanted = target.box(shape, j)
        for box, owners in holders.items():
            piece = intersect(box, wanted)
            if piece is not None:
                found.append((owners[j * len(owners) // readers], j, piece))
    return found
