"""Which data each rank must receive when an edge's two layouts differ (a "shuffle").

Rank placement: a layer with ``Layout(n, c, d, h, w)`` on ``D`` devices puts
rank ``r`` at grid coordinates ``divmod`` of ``r mod L.ranks`` in row-major
``(n, c, d, h, w)`` order; ``r // L.ranks`` is its replica index (the remaining
``D / L.ranks`` copies compute the same thing). Its part of a tensor is the box
of balanced ranges (:func:`cost_models.halo.partition`) at those coordinates
(:func:`rank_box`). Every function here reads a tensor of any rank in the
five-axis frame (``cost_models.layout.as_volume``: an image has depth 1). A dimension of extent 1 is held whole
whatever the layout says, as the runtime holds broadcast operands such as
``(N, C, 1, 1)`` scales (``runtime.placement``): the ranks differing only in
their coordinates along it hold copies.

Assumptions:
    * A rank receives each element it lacks from one holder of it (what it
      already holds it keeps): among the copies of a part, in increasing rank
      order, holder ``⌊q·copies/D⌋`` for rank ``q`` of ``D`` (as
      ``runtime.redistribute`` picks them) — the rank's own replica of the
      producer's layout when no dimension has extent 1.
    * The cost of one redistribution is that of its busiest rank: one message
      per peer, ``peers·α + bytes·β`` over the slowest link it uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from math import prod

import numpy as np

from cost_models.halo import partition
from cost_models.layout import Layout, as_volume, from_volume

__all__ = ["Box", "RankLoads", "RankTransfer", "coordinates", "holdable", "part_range", "rank_box", "rank_loads",
           "redistribution"]

Box = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class RankTransfer:
    """What one rank receives: elements, from which peers, and those peers' ranks."""

    rank: int
    elements: int
    peers: tuple[int, ...]


def rank_box(shape: Sequence[int], layout: Layout, rank: int) -> Box:
    """The index box ``((n0, n1), (c0, c1), (h0, h1), (w0, w1))`` rank ``rank`` holds of a 4-D ``shape`` (one
    range per dimension of ``shape``: ``d`` too for a volume)."""
    box = tuple(part_range(extent, parts, index)
                for extent, parts, index in zip(as_volume(shape), layout.parts(), coordinates(layout, rank)))
    return from_volume(box, len(shape))


def holdable(shape: Sequence[int], layout: Layout) -> bool:
    """Whether every rank's part of ``shape`` under ``layout`` is non-empty (an extent of 1 is held whole)."""
    return all(parts == 1 or extent == 1 or parts <= extent for extent, parts in zip(as_volume(shape), layout.parts()))


def redistribution(shape: Sequence[int], source: Layout, target: Layout, devices: int) -> list[RankTransfer]:
    """Per rank, what it must receive to go from ``source`` to ``target`` layout on ``devices`` ranks.

    Each rank looks only at the source parts its wanted box overlaps (found by
    arithmetic on the balanced split), so the work per rank grows with its
    peers, not with the number of ranks.

    Raises:
        InputError: ``source`` splits an extent (other than 1) into empty parts.
    """
    shape = as_volume(shape)
    _check_holdable(shape, source)
    blocks, copies = _holder_arrays(shape, source, devices)
    transfers = []
    for rank in range(devices):
        wanted = _held_box(shape, target, rank)
        block, held = int(blocks[rank]), [int(coords[rank]) for coords in copies]
        overlaps = [[(held[d], 1)] if extent == 1 else _overlapping_parts(extent, parts, lo, hi)
                    for d, (extent, parts, (lo, hi)) in enumerate(zip(shape, source.parts(), wanted))]
        own = _held_box(shape, source, rank)
        elements, peers = 0, []
        for combination in product(*overlaps):
            box = tuple(part_range(extent, parts, index) if extent > 1 else (0, 1)
                        for extent, parts, (index, _) in zip(shape, source.parts(), combination))
            if box != own:
                elements += prod(length for _, length in combination)
                peers.append(block * source.ranks + _rank_of(source, [index for index, _ in combination]))
        transfers.append(RankTransfer(rank, elements, tuple(sorted(peers))))
    return transfers


def _held_box(shape: Sequence[int], layout: Layout, rank: int) -> Box:
    """:func:`rank_box` with every dimension of extent 1 held whole."""
    return tuple((0, 1) if extent == 1 else part_range(extent, parts, index)
                 for extent, parts, index in zip(shape, layout.parts(), coordinates(layout, rank)))


def _check_holdable(shape: Sequence[int], layout: Layout) -> None:
    for extent, parts in zip(shape, layout.parts()):
        if extent != 1:
            partition(extent, parts)  # raises: empty parts


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
    shape = as_volume(shape)
    _check_holdable(shape, source)
    targets = [target] if isinstance(target, Layout) else list(target)
    wanted_coords = [np.stack(axis) for axis in zip(*(_coordinate_arrays(layout, devices) for layout in targets))]
    held_coords = _coordinate_arrays(source, devices)
    target_parts = np.array([layout.parts() for layout in targets], dtype=np.int64).T[:, :, None]
    volume, own, count = (np.ones((len(targets), devices), np.int64) for _ in range(3))
    first_rank, last_rank, own_rank, step = (np.zeros((len(targets), devices), np.int64) for _ in range(4))
    block, copy_coords = _holder_arrays(shape, source, devices)
    stride = source.ranks
    for extent, src_parts, dst_parts, want, held, copy in zip(shape, source.parts(), target_parts, wanted_coords,
                                                              held_coords, copy_coords):
        stride //= src_parts
        if extent == 1:  # held whole by every rank: received (if at all) from the copy at ``copy``
            first, last = copy, copy
        else:
            lo, hi = _range_arrays(extent, dst_parts, want)
            first, last = _part_of_array(extent, src_parts, lo), _part_of_array(extent, src_parts, hi - 1)
            own_lo, own_hi = _range_arrays(extent, src_parts, held)
            volume *= hi - lo
            own *= np.maximum(0, np.minimum(own_hi, hi) - np.maximum(own_lo, lo))
            count *= last - first + 1
            step = np.where(last > first, stride, step)
        first_rank, last_rank = first_rank * src_parts + first, last_rank * src_parts + last
        own_rank = own_rank * src_parts + (copy if extent == 1 else held)
    lowest, highest = _peer_span(np.arange(devices, dtype=np.int64), block * source.ranks,
                                 (first_rank, last_rank, own_rank, step), own > 0, count - (own > 0))
    loads = RankLoads(volume - own, count - (own > 0), lowest, highest)
    if isinstance(target, Layout):
        return RankLoads(loads.elements[0], loads.peers[0], loads.lowest[0], loads.highest[0])
    return loads


def _peer_span(ranks: np.ndarray, base: np.ndarray, grid: tuple[np.ndarray, ...], holds: np.ndarray,
               peers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lowest and highest rank each rank talks to, itself included.

    The holders of the parts a rank wants form a box of the source grid
    (``first``/``last`` corners, row-major from ``base``). Its own part, when
    it is among them, is not received: a corner that is its own part gives
    way to its neighbour along the last dimension the box spans (``step``),
    since the copy of that part the formula names need not be the rank itself.
    """
    first, last, own, step = grid
    low = np.where(holds & (first == own), first + step, first)
    high = np.where(holds & (last == own), last - step, last)
    some = peers > 0
    return (np.where(some, np.minimum(ranks, base + low), ranks),
            np.where(some, np.maximum(ranks, base + high), ranks))


def _holder_arrays(shape: Sequence[int], source: Layout, devices: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per rank, the replica block and the coordinates along extent-1 dimensions of the copies it receives from.

    Copies of a part differ in their replica block and their coordinates along
    the dimensions of extent 1; in increasing rank order (block, then those
    coordinates row-major) rank ``q`` takes copy ``⌊q / distinct parts⌋``.
    """
    ranks = np.arange(devices, dtype=np.int64)
    whole = [extent == 1 and parts > 1 for extent, parts in zip(shape, source.parts())]
    distinct = prod(parts for parts, kept in zip(source.parts(), whole) if not kept)
    copy, coords = ranks // distinct, [np.zeros(devices, np.int64) for _ in range(len(whole))]
    for d in reversed(range(len(whole))):
        if whole[d]:
            copy, coords[d] = np.divmod(copy, source.parts()[d])
    return copy, coords


@lru_cache(maxsize=4096)
def _coordinate_arrays(layout: Layout, devices: int) -> tuple[np.ndarray, ...]:
    """Each rank's part index along n, c, d, h, w (read-only arrays, shared between calls)."""
    coords, rest = [], np.arange(devices, dtype=np.int64) % layout.ranks
    for parts in reversed(layout.parts()):
        rest, index = np.divmod(rest, parts)
        index.flags.writeable = False
        coords.append(index)
    coords.reverse()
    return tuple(coords)


def _range_arrays(extent: int, parts: int | np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    """Grid coordinates ``[n, c, d, h, w]`` of ``rank`` under ``layout`` (row-major, ``rank mod layout.ranks``)."""
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
