"""What a loss kept split knows of each tensor it computes: how the ranks hold it (:class:`Parts`), and the grid
of ranks and groups it may sum over (:class:`LossGrid`).

Assumptions, checked by the rules (``rules``) or refused with :class:`Unsplittable`:

* every rank runs the loss function on its own box of the output and of the
  target, with the same Python control flow (shapes of the same rank, the
  same branches) — what the function does on one rank it does on every one;
* a tensor the loss makes without the model's output or target (a constant,
  class weights) is the same on every rank; one made by a factory
  (``zeros``, ``ones``, ``full``, …) is constant along every dimension and so
  may stand beside a split one of its local size;
* a size read from a split dimension is this rank's size, good for shaping
  tensors; used in arithmetic (a count for a mean taken by hand) it would be
  a wrong count, so it is refused (:class:`LocalSize`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import NoReturn, Protocol

import torch
import torch.distributed as dist

__all__ = ["LocalSize", "LossGrid", "Parts", "Tracker", "Unsplittable", "uniform"]


class Unsplittable(Exception):
    """The loss did something this module cannot keep split (``what``): it is taken of the gathered output."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


@dataclass(frozen=True)
class Parts:
    """How the ranks hold one tensor of a loss: per dimension the layout axes that split it (empty: whole; two
    or more where split dimensions were flattened together) and its global extent; the axes over which each
    rank holds only a partial sum (the true value is the sum over those ranks); ``uniform``: constant along
    every dimension (made by a factory), so it may be split like anything it meets."""

    axes: tuple[frozenset[str], ...]
    extents: tuple[int, ...]
    partial: frozenset[str] = frozenset()
    uniform: bool = False

    @property
    def split(self) -> frozenset[str]:
        """Every axis splitting some dimension."""
        return frozenset().union(*self.axes)

    @property
    def trivial(self) -> bool:
        """Held whole and complete on every rank (an ordinary tensor)."""
        return not self.split and not self.partial

    def __str__(self) -> str:
        dims = "·".join("".join(sorted(a)) or "_" for a in self.axes)
        return f"[{dims}]" + (f" partial over {''.join(sorted(self.partial))}" if self.partial else "")


def uniform(tensor: torch.Tensor) -> Parts:
    """The parts of a tensor a factory made: whole, complete and constant."""
    return Parts(tuple(frozenset() for _ in tensor.shape), tuple(tensor.shape), uniform=True)


class LocalSize(int):
    """A split dimension's size on this rank: good as a size, refused in arithmetic (it is not the global one)."""

    def _refuse(self, *_: object) -> NoReturn:
        raise Unsplittable("arithmetic on the size of a split dimension (a count taken from a tile's shape)")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __pow__ = __float__ = _refuse


@dataclass(frozen=True)
class LossGrid:
    """The ranks a loss is split over: each split axis's number of parts (``n``, ``d``, ``h``, ``w``), the
    ranks holding a share of the loss (``ranks``, copies included) and the groups it may sum over, each with
    the axes along which its members differ."""

    parts: dict[str, int]
    ranks: int
    groups: tuple[tuple[frozenset[str], dist.ProcessGroup | None], ...] = field(default=())

    def group_for(self, summed: frozenset[str], replicated: frozenset[str]) -> tuple[dist.ProcessGroup | None, int]:
        """The smallest group whose members differ along every axis of ``summed`` and otherwise only along axes
        of ``replicated`` (the value is the same there), and the number of those copies it counts."""
        fits = [(prod(self.parts[a] for a in varying), group, varying) for varying, group in self.groups
                if summed <= varying and varying - summed <= replicated]
        if not fits:
            raise Unsplittable(f"a sum over the axes {''.join(sorted(summed))} alone")
        _, group, varying = min(fits, key=lambda fit: fit[0])
        return group, prod(self.parts[a] for a in varying - summed)

    def share(self, partial: frozenset[str]) -> float:
        """What this rank's value of a scalar loss (partial over ``partial``) is scaled by so that the shares of
        every rank sum to the loss."""
        return prod(self.parts[a] for a in partial) / self.ranks


class Tracker(Protocol):
    """What a rule asks of the evaluation it runs in (``mode.SplitEvaluation``)."""

    grid: LossGrid

    def parts(self, value: object) -> Parts | None:
        """The parts of a tensor the loss computed from the output or target (``None``: an ordinary one)."""

    def mark(self, tensor: torch.Tensor, parts: Parts) -> torch.Tensor:
        """Record ``parts`` for ``tensor`` (returned)."""

    def complete(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` with its partial sums added up over the ranks (itself if it has none)."""
