"""How one activation tensor ``(N, C, D, H, W)`` is split over the ranks of a layer.

``Layout(n=, c=, d=, h=, w=)`` gives the number of parts along sample, channel,
depth, height and width; ``n·c·d·h·w`` ranks work on the layer. Its short form
omits the dimensions that are not split: ``Layout(n=4, h=2, w=2)`` prints as
``n4·h2·w2`` and the unsplit layout as ``n1``. ``Layout.parse`` reads that form
back (``.`` or ``*`` may stand for ``·``, so it can be typed on any keyboard).

Tensors of other ranks name a subset of the axes (:func:`axes_of`): an image
``(N, C, H, W)`` has no depth, a sequence ``(N, C, L)`` splits its length as
``w``, and so do a transformer's tokens ``(N, L, E)`` (order ``nwc``: their
embedding is the channel axis; ``Layout.parse`` reads ``t2`` as ``w2``). :func:`as_volume` puts any of
them in the five-axis frame (extent 1 on the axes it lacks), where a dimension of extent 1 is held whole whatever the
layout says.

A dimension of extent ``E`` split into ``p`` parts gives balanced parts, as
``torch.tensor_split`` does (sizes differ by at most one);
:meth:`Layout.local_shape` returns the largest part, ``⌈E/p⌉``, the one that
bounds time and memory.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import product
from operator import attrgetter
from typing import TypeVar

from cost_models.errors import InputError

__all__ = ["DIMS", "Layout", "as_volume", "axes_of", "from_volume", "layouts_dividing", "whole_channels"]

T = TypeVar("T")

DIMS: tuple[str, ...] = ("n", "c", "d", "h", "w")
_AXES = {1: "n", 2: "nc", 3: "ncw", 4: "nchw", 5: "ncdhw"}
_PICK = {rank: attrgetter(*axes) if len(axes) > 1 else (lambda layout: (layout.n,)) for rank, axes in _AXES.items()}
_PART = re.compile(r"^([ncdhwt])(\d+)$")
_ALIASES = {"t": "w"}  # tokens (N, L, E) hold their length on the w axis, as a sequence (N, C, L) does
_SEPARATORS = re.compile(r"[·.*]")


@dataclass(frozen=True, order=True)
class Layout:
    """Number of parts along sample (``n``), channel (``c``), depth (``d``), height (``h``), width (``w``).

    Construct with keywords (``Layout(n=4, h=2)``): the fields are keyword-only, so a four-number call written
    for the 2-D form cannot silently mean depth.
    """

    n: int = field(default=1, kw_only=True)
    c: int = field(default=1, kw_only=True)
    d: int = field(default=1, kw_only=True)
    h: int = field(default=1, kw_only=True)
    w: int = field(default=1, kw_only=True)

    def __post_init__(self) -> None:
        counts = (self.n, self.c, self.d, self.h, self.w)
        if any(type(parts) is not int for parts in counts) or min(counts) < 1:  # (a bool is no count either)
            dim, parts = next((dim, parts) for dim, parts in zip(DIMS, counts)
                              if type(parts) is not int or parts < 1)
            raise InputError(f"Layout.{dim} must be a positive integer, got {parts!r}")
        object.__setattr__(self, "_hash", hash((self.n, self.c, self.d, self.h, self.w)))  # keys of every cost memo

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    @property
    def ranks(self) -> int:
        """Number of ranks that work on the layer: ``n·c·d·h·w``."""
        return self.n * self.c * self.d * self.h * self.w

    @property
    def spatial(self) -> int:
        """Number of spatial tiles per sample: ``d·h·w``."""
        return self.d * self.h * self.w

    def parts(self) -> tuple[int, int, int, int, int]:
        """The five split counts in ``(n, c, d, h, w)`` order."""
        return (self.n, self.c, self.d, self.h, self.w)

    def parts_of(self, rank: int) -> tuple[int, ...]:
        """The split counts of the axes a ``rank``-D tensor holds (:func:`axes_of`), in its order."""
        if rank not in _PICK:
            axes_of(rank)  # raises: a rank other than 1 to 5
        return _PICK[rank](self)

    def items(self) -> Iterator[tuple[str, int]]:
        """``(dimension letter, parts)`` pairs in ``n, c, d, h, w`` order."""
        return iter(zip(DIMS, self.parts()))

    def divides(self, shape: tuple[int, ...]) -> bool:
        """Whether every split divides its extent of ``shape`` (3-D, 4-D or 5-D) exactly."""
        return all(extent % parts == 0 for extent, parts in zip(_spatial_shape(shape), self.parts_of(len(shape))))

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether every part gets at least one element (near-equal split possible); an extent not split fits
        whatever it is (an empty one too: a slice ``x[..., :0]``)."""
        return all(parts == 1 or parts <= extent
                   for extent, parts in zip(_spatial_shape(shape), self.parts_of(len(shape))))

    def local_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The largest local part of a 3-D, 4-D or 5-D ``shape`` under this layout (ceil division)."""
        return tuple(-(-extent // parts) for extent, parts in zip(_spatial_shape(shape), self.parts_of(len(shape))))

    def to_dict(self) -> dict[str, int]:
        """JSON form: ``{"n": 4, "c": 1, "d": 1, "h": 2, "w": 2}``."""
        return dict(self.items())

    @classmethod
    def from_dict(cls, data: dict[str, int]) -> Layout:
        """Inverse of :meth:`to_dict`; missing dimensions default to 1."""
        unknown = set(data) - set(DIMS)
        if unknown:
            raise InputError(f"layout has unknown dimensions {sorted(unknown)}; use only n, c, d, h, w")
        return cls(**{dim: data.get(dim, 1) for dim in DIMS})

    @classmethod
    def parse(cls, text: str) -> Layout:
        """Read the short form (``n4·h2·w2``, ``n4.h2``, ``n1``) back into a Layout; ``t`` (tokens) is ``w``.

        Raises:
            InputError: Unknown letters, repeated dimensions, or non-positive counts.
        """
        counts: dict[str, int] = {}
        for token in _SEPARATORS.split(text.strip()):
            match = _PART.match(token.strip())
            if match is None:
                raise InputError(
                    f"cannot read layout {text!r}: part {token!r} is not a letter n/c/d/h/w/t followed by a count "
                    f"(example: n4·h2·w2)"
                )
            dim, count = _ALIASES.get(match.group(1), match.group(1)), int(match.group(2))
            if dim in counts:
                raise InputError(f"cannot read layout {text!r}: dimension {dim!r} appears twice (t is w: tokens)")
            counts[dim] = count
        try:
            return cls(**counts)
        except InputError as err:
            raise InputError(f"cannot read layout {text!r}: {err}") from err

    def __str__(self) -> str:
        split = [f"{dim}{parts}" for dim, parts in self.items() if parts > 1]
        return "·".join(split) if split else "n1"


def layouts_dividing(devices: int, *, depth: bool = False) -> list[Layout]:
    """Every Layout whose rank count divides ``devices`` (the rest hold copies), fewest ranks first; with ``depth``
    those splitting ``d`` too (a model of volumes), else ``d = 1``."""
    return list(_layouts_dividing(devices, depth))


@lru_cache(maxsize=64)
def _layouts_dividing(devices: int, depth: bool) -> tuple[Layout, ...]:
    divisors = [d for d in range(1, devices + 1) if devices % d == 0]
    layouts = {Layout(n=n, c=c, d=d, h=h, w=w) for n, c, h, w in product(divisors, repeat=4)
               for d in (divisors if depth else (1,)) if devices % (n * c * d * h * w) == 0}
    return tuple(sorted(layouts, key=lambda layout: (layout.ranks, layout.parts())))


def axes_of(rank: int) -> str:
    """The axes a ``rank``-D activation holds, in order: ``ncdhw`` (volumes), ``nchw`` (images), ``ncw``
    (sequences: the length is split as ``w``), ``nc``, ``n``.

    Raises:
        InputError: A rank other than 1 to 5.
    """
    if rank not in _AXES:
        raise InputError(f"a Layout splits tensors of 1 to 5 dimensions (N, C, D, H, W), got {rank}")
    return _AXES[rank]


def as_volume(shape: Sequence[int]) -> tuple[int, int, int, int, int]:
    """``shape`` in the five-axis frame ``(N, C, D, H, W)``: extent 1 on the axes its rank lacks."""
    extents = dict(zip(axes_of(len(shape)), (int(extent) for extent in shape)))
    n, c, d, h, w = (extents.get(axis, 1) for axis in DIMS)
    return n, c, d, h, w


def from_volume(values: Sequence[T], rank: int) -> tuple[T, ...]:
    """The entries of a five-axis tuple (``n, c, d, h, w``) that a ``rank``-D tensor holds, in its order."""
    return tuple(values[DIMS.index(axis)] for axis in axes_of(rank))


def _spatial_shape(shape: Sequence[int]) -> tuple[int, ...]:
    if len(shape) not in (3, 4, 5):
        raise InputError(f"a Layout splits 3-D (N, C, L), 4-D (N, C, H, W) and 5-D (N, C, D, H, W) tensors, got "
                         f"shape {tuple(shape)}")
    return tuple(int(extent) for extent in shape)


@lru_cache(maxsize=8192)
def whole_channels(layout: Layout) -> Layout:
    """``layout`` with its channels whole (``c = 1``): what a filter split reads (made once per layout)."""
    return replace(layout, c=1)
