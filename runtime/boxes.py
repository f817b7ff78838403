"""A rank's box of a value (one ``[start, stop)`` range per dimension) and its elements in row-major order: what
lets a view with written sizes run on a rank's part exactly (``runtime.shapes``), and what verification and the
inputs cut."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.placement import Placement

__all__ = ["flat_runs", "nd_box"]


def nd_box(shape: Sequence[int], placement: Placement, member: int) -> tuple[tuple[int, int], ...] | None:
    """Member ``member``'s box of a value of global ``shape``, one range per dimension of the value.

    Values other than 2-D and 4-D are split by sample only (their features are flattened into the
    placement's channels); ``None`` when the placement would split those features.
    """
    if not shape:
        return ()
    if placement.holds(shape):  # an ordered value (4-D, or a reshape's 5-D view): its own dimensions
        return placement.box(tuple(int(s) for s in shape), member)
    features = 1
    for extent in shape[1:]:
        features *= int(extent)
    four = tuple(int(s) for s in shape) if len(shape) == 4 else (int(shape[0]), features, 1, 1)
    box = placement.box(four, member)
    if len(shape) in (1, 2, 4):
        return box[:len(shape)]
    if box[1] != (0, features):
        return None
    return (box[0], *((0, int(s)) for s in shape[1:]))


def flat_runs(shape: Sequence[int], box: Sequence[tuple[int, int]]) -> tuple[tuple[int, int, int], ...]:
    """The elements of ``box`` in the row-major order of ``shape``, as maximal ``(extent, start, stop)`` runs.

    Dimensions are merged while the inner one is whole or the outer one holds a single index, so two boxes
    of two shapes with equal runs hold the same elements of the flattened tensor, in the same order (a
    reshape of one is the other).
    """
    if any(start >= stop for start, stop in box):
        return ((0, 0, 0),)
    runs: list[tuple[int, int, int]] = []
    for extent, (start, stop) in zip(shape, box):
        if int(extent) == 1:
            continue
        runs.append((int(extent), int(start), int(stop)))
        while len(runs) > 1 and _mergeable(runs[-2], runs[-1]):
            inner = runs.pop()
            runs[-1] = _merged(runs[-1], inner)
    return tuple(runs)


def _mergeable(outer: tuple[int, int, int], inner: tuple[int, int, int]) -> bool:
    return (inner[1] == 0 and inner[2] == inner[0]) or outer[2] - outer[1] == 1


def _merged(outer: tuple[int, int, int], inner: tuple[int, int, int]) -> tuple[int, int, int]:
    extent = outer[0] * inner[0]
    if inner[1] == 0 and inner[2] == inner[0]:
        return extent, outer[1] * inner[0], outer[2] * inner[0]
    return extent, outer[1] * inner[0] + inner[1], outer[1] * inner[0] + inner[2]
