"""Which box of a tensor each member of a group holds: a Layout's grid, with some dimensions kept whole.

A :class:`Placement` puts member ``q`` of a group at the grid coordinates of
``q mod layout.ranks`` under its Layout (row-major over ``n, c, h, w``, as
``cost_models.redistribution`` places ranks) and gives it the balanced part of
each dimension at those coordinates — except along the dimensions named in
``whole``, which it holds entirely. ``Placement(layout)`` is exactly
``rank_box``'s placement. ``whole`` describes the tensors a layer reads or makes
in full along a split dimension:

* the input of a filter-split (``c > 1``) convolution or linear layer: every
  input channel, at the sample and spatial coordinates of the layer's output
  (``Placement(L, "c")``);
* the output of a global pooling over spatial tiles: whole on each tile of the
  group (``Placement(L, "hw")``).

A 4-D value whose dimensions hold the axes in another order (``order``:
``nhwc`` for channels-last blocks, ``cost_models.ir.orders``) is split by axis
wherever its order puts it. A dimension of extent 1 is held whole whatever the layout says (broadcast
operands such as ``(N, C, 1, 1)`` scales, and pooled ``1×1`` maps).

Members whose boxes are equal hold copies. The distinct boxes of a placement
tile the tensor, which :mod:`runtime.redistribute` relies on.

An operand every rank holds whole (a parameter, a tensor computed from
parameters) meets a box of the batch in element-wise layers through
broadcasting: :func:`broadcast_part` cuts the part of it that broadcasts onto
a box of the output, aligning dimensions from the right as PyTorch does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cost_models.ir.layer import Layer
from cost_models.ir.orders import default_order
from cost_models.layout import DIMS, Layout
from cost_models.redistribution import Box, coordinates, part_range

__all__ = ["Placement", "as_placement", "box_extent", "box_view", "broadcast_part", "intersect", "value_placement"]


@dataclass(frozen=True)
class Placement:
    """Member ``q`` holds the box of ``layout``'s grid at ``q mod layout.ranks``, whole along ``whole``."""

    layout: Layout
    whole: str = ""
    order: str = "nchw"

    def __post_init__(self) -> None:
        unknown = set(self.whole) - set(DIMS)
        if unknown:
            raise ValueError(f"Placement.whole names dimensions {sorted(unknown)}; use letters of {''.join(DIMS)}")
        letters = self.order.replace(".", "")
        if set(letters) - set(DIMS) or len(set(letters)) != len(letters):
            raise ValueError(f"Placement.order {self.order!r} must name each of the axes {''.join(DIMS)} at most once "
                             f"(a dimension holding none of them: '.')")

    def __str__(self) -> str:
        return f"{self.layout}" + (f" ({self.whole} whole)" if self.whole else "") + (
            f" [{self.order}]" if self.order != "nchw" else "")

    def box(self, shape: Sequence[int], member: int) -> Box:
        """The index box of ``shape`` (as many dimensions as ``order``: 4-D by default) that ``member`` holds, one
        range per dimension: dimension ``i`` holds the axis ``order[i]`` (``((n0, n1), (c0, c1), (h0, h1), (w0,
        w1))`` in the default ``nchw``); a dimension holding none (``.``) is whole."""
        coords = dict(zip(DIMS, coordinates(self.layout, member)))
        return tuple(
            (0, extent) if dim == "." or dim in self.whole or getattr(self.layout, dim) == 1 or extent == 1
            else part_range(extent, getattr(self.layout, dim), coords[dim])
            for dim, extent in zip(self.order, shape)
        )

    def holds(self, shape: Sequence[int]) -> bool:
        """Whether ``order`` names the dimensions of ``shape`` itself (otherwise a value other than 4-D is held
        flattened, ``(N, features, 1, 1)``)."""
        return len(self.order) == len(shape)

    def keeps(self, dim: str) -> bool:
        """Whether ``dim`` is split (neither unsplit in the layout nor held whole)."""
        return dim not in self.whole and getattr(self.layout, dim) > 1


def value_placement(layout: Layout, layer: Layer) -> Placement:
    """Where a layer under ``layout`` puts its value (``layer``: its LayerGraph node): its grid, in the value's
    order."""
    shape = layer.output_shape or []
    rank = len(shape) if shape and not isinstance(shape[0], list) else 4
    return Placement(layout, order=layer.attrs.get("order") or default_order(rank) or "nchw")


def as_placement(value: Layout | Placement) -> Placement:
    """``value`` as a Placement (a Layout is its own grid, nothing whole)."""
    return value if isinstance(value, Placement) else Placement(value)


def box_extent(box: Box) -> tuple[int, ...]:
    """The shape of the block ``box`` covers."""
    return tuple(stop - start for start, stop in box)


def intersect(a: Box, b: Box) -> Box | None:
    """The block two boxes share, or ``None`` when they share nothing."""
    box = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b))
    return box if all(lo < hi for lo, hi in box) else None


def box_view(tensor: torch.Tensor, origin: Box, box: Box) -> torch.Tensor:
    """The view of ``tensor`` (which covers ``origin``) that holds ``box``."""
    view = tensor
    for dim, ((start, _), (lo, hi)) in enumerate(zip(origin, box)):
        view = view.narrow(dim, lo - start, hi - lo)
    return view


def broadcast_part(operand: torch.Tensor, box: Sequence[tuple[int, int]]) -> torch.Tensor:
    """The part of a whole ``operand`` that broadcasts onto ``box`` (one range per dimension of the output).

    Dimensions align from the right; an operand dimension of extent 1 broadcasts and is kept, any other is
    the output's and is cut to the box's range (the gradient of the rest is other ranks' share).
    """
    lead = len(box) - operand.dim()
    if lead < 0:
        raise ValueError(f"an operand of shape {tuple(operand.shape)} cannot broadcast onto a {len(box)}-D box")
    for dim, extent in enumerate(operand.shape):
        start, stop = box[lead + dim]
        if extent != 1 and (start, stop) != (0, extent):
            operand = operand.narrow(dim, start, stop - start)
    return operand
