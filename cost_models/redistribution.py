"""Which data each rank must receive when an edge's two layouts differ (a "shuffle").

Rank placement: a layer with ``Layout(n, c, h, w)`` on ``D`` devices puts rank
``r`` at grid coordinates ``divmod`` of ``r mod L.ranks`` in row-major
``(n, c, h, w)`` order; ``r // L.ranks`` is its replica index (the remaining
``D / L.ranks`` copies compute the same thing). Its part of a 4-D tensor is
the box of balanced ranges (:func:`cost_models.halo.partition`) at those
coordinates.

Assumptions:
    * A rank receives from the ranks of its own replica of the producer's
      layout (they tile the whole tensor, so every element it lacks is found
      once); what it already holds it keeps.
    * The cost of one redistribution is that of its busiest rank: one message
      per peer, ``peers·α + bytes·β`` over the slowest link it uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Sequence

from cost_models.halo import partition
from cost_models.layout import Layout

__all__ = ["Box", "RankTransfer", "rank_box", "redistribution"]

Box = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class RankTransfer:
    """What one rank receives: elements, from which peers, and those peers' ranks."""

    rank: int
    elements: int
    peers: tuple[int, ...]


def rank_box(shape: Sequence[int], layout: Layout, rank: int) -> Box:
    """The index box ``((n0, n1), (c0, c1), (h0, h1), (w0, w1))`` rank ``rank`` holds."""
    coords, rest = [], rank % layout.ranks
    for parts in reversed(layout.parts()):
        rest, index = divmod(rest, parts)
        coords.append(index)
    coords.reverse()
    return tuple(partition(extent, parts)[index] for extent, parts, index in zip(shape, layout.parts(), coords))


def redistribution(shape: Sequence[int], source: Layout, target: Layout, devices: int) -> list[RankTransfer]:
    """Per rank, what it must receive to go from ``source`` to ``target`` layout on ``devices`` ranks."""
    transfers = []
    for rank in range(devices):
        wanted = rank_box(shape, target, rank)
        replica = (rank // source.ranks) * source.ranks
        elements, peers = 0, []
        for holder in range(replica, replica + source.ranks):
            if holder == rank:
                continue
            overlap = _volume(_intersect(wanted, rank_box(shape, source, holder)))
            if overlap:
                elements += overlap
                peers.append(holder)
        transfers.append(RankTransfer(rank, elements, tuple(peers)))
    return transfers


def _intersect(a: Box, b: Box) -> Box:
    return tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b))


def _volume(box: Box) -> int:
    return prod(max(0, stop - start) for start, stop in box)
