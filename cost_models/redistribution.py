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
from itertools import product
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
    return tuple(_part_range(extent, parts, index)
                 for extent, parts, index in zip(shape, layout.parts(), _coordinates(layout, rank)))


def redistribution(shape: Sequence[int], source: Layout, target: Layout, devices: int) -> list[RankTransfer]:
    """Per rank, what it must receive to go from ``source`` to ``target`` layout on ``devices`` ranks.

    Each rank looks only at the source parts its wanted box overlaps (found by
    arithmetic on the balanced split), so the work per rank grows with its
    peers, not with the number of ranks.
    """
    for extent, parts in zip(shape, source.parts()):
        partition(extent, parts)  # refuses splits into empty parts, as rank_box does
    transfers = []
    for rank in range(devices):
        wanted = rank_box(shape, target, rank)
        overlaps = [_overlapping_parts(extent, parts, lo, hi)
                    for extent, parts, (lo, hi) in zip(shape, source.parts(), wanted)]
        base = (rank // source.ranks) * source.ranks
        elements, peers = 0, []
        for combination in product(*overlaps):
            holder = base + _rank_of(source, [index for index, _ in combination])
            if holder != rank:
                elements += prod(length for _, length in combination)
                peers.append(holder)
        transfers.append(RankTransfer(rank, elements, tuple(sorted(peers))))
    return transfers


def _coordinates(layout: Layout, rank: int) -> list[int]:
    coords, rest = [], rank % layout.ranks
    for parts in reversed(layout.parts()):
        rest, index = divmod(rest, parts)
        coords.append(index)
    coords.reverse()
    return coords


def _rank_of(layout: Layout, coords: Sequence[int]) -> int:
    rank = 0
    for parts, index in zip(layout.parts(), coords):
        rank = rank * parts + index
    return rank


def _part_range(extent: int, parts: int, index: int) -> tuple[int, int]:
    base, extra = divmod(extent, parts)
    if base == 0:
        partition(extent, parts)  # raises: empty parts
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def _part_of(extent: int, parts: int, position: int) -> int:
    base, extra = divmod(extent, parts)
    big = extra * (base + 1)
    return position // (base + 1) if position < big else extra + (position - big) // base


def _overlapping_parts(extent: int, parts: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """``(part index, overlap length)`` of the parts of a balanced split that overlap ``[lo, hi)``."""
    found = []
    index = _part_of(extent, parts, lo)
    while index < parts:
        start, stop = _part_range(extent, parts, index)
        if start >= hi:
            break
        found.append((index, min(stop, hi) - max(start, lo)))
        index += 1
    return found
