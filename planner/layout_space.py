"""The layouts a layer may take on a stage's devices, before any is priced (``planner.space``'s candidates).

``Layout(n, c, d, h, w)`` with ``n·c·d·h·w`` equal to the devices, each split
dividing its extent of the layer's output exactly (or, where none does, the
layouts of fewer ranks that divide it); channels split within a node; spatial
tiles in rows only, columns only or the most nearly square grid (images), in
slabs, pencils or cubes (volumes).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from cost_models.ir.layer import Layer
from cost_models.layout import Layout, layouts_dividing

__all__ = ["layout_tiers", "space_size", "splits_exactly"]


def splits_exactly(shape: Sequence[int], devices: int, per_node: int) -> bool:
    """Whether a tensor of ``shape`` has a layout of the space on exactly ``devices`` devices (``per_node`` to a
    node) whose every split divides its extent: samples and channels by divisors, the rest of the devices in
    tiles of one of the space's grids (without enumerating every layout of ``devices``)."""
    volume = len(shape) == 5
    for n in (n for n in range(1, devices + 1) if devices % n == 0 and shape[0] % n == 0):
        for c in (c for c in range(1, min(devices // n, max(per_node, 1)) + 1) if devices // n % c == 0):
            tiles = devices // (n * c)
            grids = _volume_tilings(tiles) if volume else {(1, h, w) for h, w in _tilings(tiles)}
            if any(_divides(list(shape), Layout(n=n, c=c, d=d, h=h, w=w)) for d, h, w in grids):
                return True
    return False


def layout_tiers(node: Layer, devices: int, per_node: int) -> list[list[Layout]]:
    """Layouts of the space (module docstring) that divide the output: on all devices first, then fewer ranks."""
    return [list(tier) for tier in _tiers(json.dumps(node.output_shape), devices, per_node)]


@lru_cache(maxsize=1024)
def _tiers(shape_text: str, devices: int, per_node: int) -> tuple[tuple[Layout, ...], tuple[Layout, ...]]:
    shape = json.loads(shape_text)
    volume = len(shape) == 5
    dividing = [layout for layout in _tiled(devices, volume, per_node) if _divides(shape, layout)]
    return (tuple(lay for lay in dividing if lay.ranks == devices),
            tuple(lay for lay in dividing if lay.ranks < devices))


def space_size(devices: int, *, volume: bool, per_node: int) -> int:
    """How many layouts of the space (module docstring) a layer may take on ``devices`` devices, before its shape
    rules any out: the work of pricing a decision there, roughly."""
    return len(_tiled(devices, volume, per_node))


@lru_cache(maxsize=64)
def _tiled(devices: int, volume: bool, per_node: int) -> tuple[Layout, ...]:
    """The layouts of the space on ``devices`` before the tensor is asked: channels split within a node, spatial
    tiles in one of :func:`_tilings` (images) or :func:`_volume_tilings` (volumes)."""
    return tuple(layout for layout in layouts_dividing(devices, depth=volume) if layout.c <= max(per_node, 1)
                 and ((layout.d, layout.h, layout.w) in _volume_tilings(layout.spatial) if volume
                      else (layout.h, layout.w) in _tilings(layout.spatial)))


@lru_cache(maxsize=256)
def _tilings(tiles: int) -> frozenset[tuple[int, int]]:
    """Rows-only, columns-only and the most nearly square ``(h, w)`` grid of ``tiles`` tiles (``h ≥ w``)."""
    rows = min(h for h in range(1, tiles + 1) if tiles % h == 0 and h * h >= tiles)
    return frozenset({(tiles, 1), (1, tiles), (rows, tiles // rows)})


@lru_cache(maxsize=256)
def _volume_tilings(tiles: int) -> frozenset[tuple[int, int, int]]:
    """The ``(d, h, w)`` grids of ``tiles`` tiles a volume may take: slabs (one axis split), pencils (the most
    nearly square split of two axes, either way round) and cubes (the most nearly cubic split of all three, in
    every order) — each priced, none preferred: which wins depends on the halos, the extents and the links."""
    found: set[tuple[int, int, int]] = set()
    for axes in ((0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2)):
        for counts in _balanced(tiles, len(axes)):
            grid = [1, 1, 1]
            for axis, count in zip(axes, counts):
                grid[axis] = count
            found.add((grid[0], grid[1], grid[2]))
    return frozenset(found)


def _balanced(tiles: int, axes: int) -> set[tuple[int, ...]]:
    """Every order of the most balanced factorisation of ``tiles`` into ``axes`` factors (largest factor least)."""
    factorisations = [f for f in _factorisations(tiles, axes)]
    best = min(max(f) for f in factorisations)
    return {f for f in factorisations if max(f) == best}


def _factorisations(tiles: int, axes: int) -> list[tuple[int, ...]]:
    if axes == 1:
        return [(tiles,)]
    return [(first, *rest) for first in range(1, tiles + 1) if tiles % first == 0
            for rest in _factorisations(tiles // first, axes - 1)]


def _divides(shape: list[Any], layout: Layout) -> bool:
    """Whether ``layout`` splits an output of ``shape`` exactly (``Layer.output_shape``: a shape, or a list of
    shapes, which only the whole layout holds)."""
    if not shape or isinstance(shape[0], list):  # a tuple of tensors: kept whole
        return layout.ranks == 1
    if len(shape) in (4, 5):
        return layout.divides(tuple(shape))
    if len(shape) == 3:  # a sequence (N, C, L), its length split as w (other 3-D values: the predicate refuses)
        return layout.d == layout.h == 1 and layout.divides(tuple(shape))
    features = 1
    for extent in shape[1:]:
        features *= extent
    return layout.spatial == 1 and shape[0] % layout.n == 0 and features % layout.c == 0
