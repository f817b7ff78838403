"""How one activation tensor ``(N, C, H, W)`` is split over the ranks of a layer.

``Layout(n, c, h, w)`` gives the number of parts along sample, channel, height
and width; ``n·c·h·w`` ranks work on the layer. Its short form omits the
dimensions that are not split: ``Layout(4, 1, 2, 2)`` prints as ``n4·h2·w2``
and the unsplit layout as ``n1``. ``Layout.parse`` reads that form back (``.``
or ``*`` may stand for ``·``, so it can be typed on any keyboard).

A dimension of extent ``E`` split into ``p`` parts gives balanced parts, as
``torch.tensor_split`` does (sizes differ by at most one);
:meth:`Layout.local_shape` returns the largest part, ``⌈E/p⌉``, the one that
bounds time and memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from typing import Iterator

from cost_models.errors import InputError

__all__ = ["DIMS", "Layout", "layouts_dividing"]

DIMS: tuple[str, ...] = ("n", "c", "h", "w")
_PART = re.compile(r"^([nchw])(\d+)$")
_SEPARATORS = re.compile(r"[·.*]")


@dataclass(frozen=True, order=True)
class Layout:
    """Number of parts along sample (``n``), channel (``c``), height (``h``), width (``w``)."""

    n: int = 1
    c: int = 1
    h: int = 1
    w: int = 1

    def __post_init__(self) -> None:
        for dim in DIMS:
            parts = getattr(self, dim)
            if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
                raise InputError(f"Layout.{dim} must be a positive integer, got {parts!r}")

    @property
    def ranks(self) -> int:
        """Number of ranks that work on the layer: ``n·c·h·w``."""
        return self.n * self.c * self.h * self.w

    @property
    def spatial(self) -> int:
        """Number of spatial tiles per sample: ``h·w``."""
        return self.h * self.w

    def parts(self) -> tuple[int, int, int, int]:
        """The four split counts in ``(n, c, h, w)`` order."""
        return (self.n, self.c, self.h, self.w)

    def items(self) -> Iterator[tuple[str, int]]:
        """``(dimension letter, parts)`` pairs in ``n, c, h, w`` order."""
        return iter(zip(DIMS, self.parts()))

    def divides(self, shape: tuple[int, ...]) -> bool:
        """Whether every split divides its extent of the 4-D ``shape`` exactly."""
        return all(extent % parts == 0 for extent, parts in zip(_as_4d(shape), self.parts()))

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether every part gets at least one element (near-equal split possible)."""
        return all(parts <= extent for extent, parts in zip(_as_4d(shape), self.parts()))

    def local_shape(self, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
        """The largest local part of a 4-D ``shape`` under this layout (ceil division)."""
        return tuple(-(-extent // parts) for extent, parts in zip(_as_4d(shape), self.parts()))  # type: ignore[return-value]

    def to_dict(self) -> dict[str, int]:
        """JSON form: ``{"n": 4, "c": 1, "h": 2, "w": 2}``."""
        return dict(self.items())

    @classmethod
    def from_dict(cls, data: dict[str, int]) -> "Layout":
        """Inverse of :meth:`to_dict`; missing dimensions default to 1."""
        unknown = set(data) - set(DIMS)
        if unknown:
            raise InputError(f"layout has unknown dimensions {sorted(unknown)}; use only n, c, h, w")
        return cls(**{dim: data.get(dim, 1) for dim in DIMS})

    @classmethod
    def parse(cls, text: str) -> "Layout":
        """Read the short form (``n4·h2·w2``, ``n4.h2``, ``n1``) back into a Layout.

        Raises:
            InputError: Unknown letters, repeated dimensions, or non-positive counts.
        """
        counts: dict[str, int] = {}
        for token in _SEPARATORS.split(text.strip()):
            match = _PART.match(token.strip())
            if match is None:
                raise InputError(
                    f"cannot read layout {text!r}: part {token!r} is not a letter n/c/h/w followed by a count "
                    f"(example: n4·h2·w2)"
                )
            dim, count = match.group(1), int(match.group(2))
            if dim in counts:
                raise InputError(f"cannot read layout {text!r}: dimension {dim!r} appears twice")
            counts[dim] = count
        try:
            return cls(**counts)
        except InputError as err:
            raise InputError(f"cannot read layout {text!r}: {err}") from err

    def __str__(self) -> str:
        split = [f"{dim}{parts}" for dim, parts in self.items() if parts > 1]
        return "·".join(split) if split else "n1"


def layouts_dividing(devices: int) -> list[Layout]:
    """Every Layout whose rank count divides ``devices`` (the rest hold copies), fewest ranks first."""
    return list(_layouts_dividing(devices))


@lru_cache(maxsize=64)
def _layouts_dividing(devices: int) -> tuple[Layout, ...]:
    divisors = [d for d in range(1, devices + 1) if devices % d == 0]
    layouts = {Layout(n, c, h, w) for n, c, h, w in product(divisors, repeat=4) if devices % (n * c * h * w) == 0}
    return tuple(sorted(layouts, key=lambda layout: (layout.ranks, layout.parts())))


def _as_4d(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    if len(shape) != 4:
        raise InputError(f"a Layout splits 4-D (N, C, H, W) tensors, got shape {tuple(shape)}")
    return tuple(shape)  # type: ignore[return-value]
