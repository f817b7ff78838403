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
from functools import lru_cache
from itertools import product
from math import prod
from typing import Any, Sequence

import numpy as np

from cost_models.halo import partition
from cost_models.layout import Layout

__all__ = ["Box", "RankLoads", "RankTransfer", "coordinates", "part_range", "rank_box", "rank_loads", "redistribution"]

Box = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class RankTransfer:
    """What one rank receives: elements, from which peers, and those peers' ranks."""

    rank: int
    elements: int
    peers: tuple[int, ...]


def rank_box(shape: Sequence[int], layout: Layout, rank: int) -> Box:
    """The index box ``((n0, n1), (c0, c1), (h0, h1), (w0, w1))`` rank ``rank`` holds."""
    return tuple(part_range(extent, parts, index)
                 for extent, parts, index in zip(shape, layout.parts(), coordinates(layout, rank)))


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


@dataclass(frozen=True)
class RankLoads:
    """Per rank (arrays of length ``devices``): elements received, peers, and the span of ranks involved.

    ``lowest``/``highest`` bound the ranks a rank talks to, itself included
    (ranks are placed row-major, so every holder lies between them).
    """

    elements: np.ndarray
    peers: np.ndarray
    lowest: np.ndarray
    highest: np.ndarray


def rank_loads(shape: Sequence[int], source: Layout, target: Layout | Sequence[Layout], devices: int) -> RankLoads:
    """What :func:`redistribution` computes, for all ranks at once with array arithmetic.

    Per dimension the wanted range, the first and last source part it
    overlaps, and the overlap with the rank's own source part are closed
    forms of the balanced split; the box quantities are their products.
    Given several target layouts, every array gets a leading axis over them.
    """
    for extent, parts in zip(shape, source.parts()):
        if extent < parts:
            partition(extent, parts)  # raises: empty parts
    targets = [target] if isinstance(target, Layout) else list(target)
    ranks = np.arange(devices, dtype=np.int64)
    wanted_coords = [np.stack(axis) for axis in zip(*(_coordinate_arrays(layout, devices) for layout in targets))]
    held_coords = _coordinate_arrays(source, devices)
    target_parts = np.array([layout.parts() for layout in targets], dtype=np.int64).T[:, :, None]
    volume, own, count = (np.ones((len(targets), devices), np.int64) for _ in range(3))
    first_rank, last_rank = (np.zeros((len(targets), devices), np.int64) for _ in range(2))
    for extent, src_parts, dst_parts, want, held in zip(shape, source.parts(), target_parts, wanted_coords,
                                                        held_coords):
        lo, hi = _range_arrays(extent, dst_parts, want)
        first, last = _part_of_array(extent, src_parts, lo), _part_of_array(extent, src_parts, hi - 1)
        own_lo, own_hi = _range_arrays(extent, src_parts, held)
        volume *= hi - lo
        own *= np.maximum(0, np.minimum(own_hi, hi) - np.maximum(own_lo, lo))
        count *= last - first + 1
        first_rank, last_rank = first_rank * src_parts + first, last_rank * src_parts + last
    base = ranks // source.ranks * source.ranks
    loads = RankLoads(volume - own, count - (own > 0), np.minimum(ranks, base + first_rank),
                      np.maximum(ranks, base + last_rank))
    if isinstance(target, Layout):
        return RankLoads(loads.elements[0], loads.peers[0], loads.lowest[0], loads.highest[0])
    return loads


@lru_cache(maxsize=4096)
def _coordinate_arrays(layout: Layout, devices: int) -> tuple[np.ndarray, ...]:
    """Each rank's part index along n, c, h, w (read-only arrays, shared between calls)."""
    coords, rest = [], np.arange(devices, dtype=np.int64) % layout.ranks
    for parts in reversed(layout.parts()):
        rest, index = np.divmod(rest, parts)
        index.flags.writeable = False
        coords.append(index)
    coords.reverse()
    return tuple(coords)


def _range_arrays(extent: int, parts: Any, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    base, extra = np.divmod(extent, parts)
    start = index * base + np.minimum(index, extra)
    return start, start + base + (index < extra)


def _part_of_array(extent: int, parts: int, position: np.ndarray) -> np.ndarray:
    base, extra = divmod(extent, parts)
    if extra == 0:  # equal parts
        return position // base
    big = extra * (base + 1)
    return np.where(position < big, position // (base + 1), extra + (position - big) // max(base, 1))


def coordinates(layout: Layout, rank: int) -> list[int]:
    """Grid coordinates ``[n, c, h, w]`` of ``rank`` under ``layout`` (row-major, ``rank mod layout.ranks``)."""
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


def part_range(extent: int, parts: int, index: int) -> tuple[int, int]:
    """``[start, stop)`` of part ``index`` of a balanced ``parts``-way split of ``extent``."""
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
        start, stop = part_range(extent, parts, index)
        if start >= hi:
            break
        found.append((index, min(stop, hi) - max(start, lo)))
        index += 1
    return found
