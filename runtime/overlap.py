"""Convolution on a tile with its interior computed while the halos travel.

The output positions whose windows read only the tile's own rows (and
columns) — its *interior* — need no halo. :func:`conv2d_overlapped` posts the
first split axis's halo exchange (non-blocking), convolves the interior from
the bare tile meanwhile, then waits, completes the other axis's exchange and
convolves the border bands from the extended tile. The bands and the interior
partition the output, so the result is exactly the convolution of the
extended tile (``runtime.spatial.conv2d`` without overlap).

Used on CUDA devices only (``runtime.spatial.conv2d``'s default, priced so by
``cost_models.profile.Profile.overlaps_halos``): on CPUs the interior and its
bands cost more than the exchange they hide.

Local output row ``i`` of the extended tile reads its rows ``[i·s, i·s +
d(k−1)]``; the tile's own rows are ``[a, b)`` there (``a = own_start −
read_start``), so the interior rows are ``⌈a/s⌉ ≤ i ≤ ⌊(b − d(k−1) − 1)/s⌋``.

Only the forward pass overlaps: backward runs autograd's order (border and
interior gradients, then the adjoint exchange), as the cost model's
``overlap`` assumption does not distinguish. With a 2-D split, the second
axis's exchange (which carries the corners) waits for the first and is not
overlapped.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from runtime.halo_exchange import AxisWindow, exchange_halo, finish_halo, start_halo

__all__ = ["bands_are_uniform", "conv2d_overlapped"]

Range = tuple[int, int]


def conv2d_overlapped(tile: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      windows: Sequence[AxisWindow | None], stride: tuple[int, int], padding: tuple[int, int],
                      dilation: tuple[int, int], groups: int, uniform: bool) -> torch.Tensor:
    """``F.conv2d`` of the tile extended by its halos; ``windows[a]`` is ``None`` for an unsplit axis ``a``.

    ``padding`` applies to unsplit axes only (split axes get theirs from the exchange). ``uniform`` says that
    every tile of the grid has an interior and the same border bands (:func:`bands_are_uniform`); otherwise
    the tile is convolved after the exchange, without overlap.
    """
    split = [axis for axis in (0, 1) if windows[axis] is not None]
    reach = (dilation[0] * (weight.shape[2] - 1), dilation[1] * (weight.shape[3] - 1))
    sizes = tuple(_output_extent(tile.shape[2 + a], windows[a], stride[a], reach[a], padding[a]) for a in (0, 1))
    interior = [_interior(windows[a], stride[a], reach[a], sizes[a]) for a in (0, 1)]
    first = windows[split[0]]
    assert first is not None  # a split axis has its window
    pending = start_halo(tile, 2 + split[0], first)
    inner = None
    if uniform:
        inner = _band(tile, weight, bias, interior, windows, stride, reach, padding, dilation, groups, from_tile=True)
    extended = finish_halo(tile, pending)
    for axis in split[1:]:
        window = windows[axis]
        assert window is not None
        extended = exchange_halo(extended, 2 + axis, window)
    if inner is None:
        return F.conv2d(extended, weight, bias, stride, _local_padding(windows, padding), dilation, groups)
    return _assemble(extended, inner, weight, bias, interior, sizes, split, windows, stride, reach, padding, dilation,
                     groups)


def _assemble(extended: torch.Tensor, inner: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              interior: list[Range], sizes: tuple[int, ...], split: list[int], windows: Sequence[AxisWindow | None],
              stride: tuple[int, int], reach: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int],
              groups: int) -> torch.Tensor:
    """The interior surrounded by the border bands, axis by axis (the first split axis's bands span everything)."""
    region: list[Range] = [(0, sizes[0]), (0, sizes[1])]
    bands = []
    for axis in split:
        low, high = list(region), list(region)
        low[axis], high[axis] = (0, interior[axis][0]), (interior[axis][1], sizes[axis])
        bands.append((axis, [_band(extended, weight, bias, part, windows, stride, reach, padding, dilation, groups)
                             if part[axis][0] < part[axis][1] else None for part in (low, high)]))
        region[axis] = interior[axis]
    result = inner
    for axis, (low_band, high_band) in reversed(bands):
        result = torch.cat([band for band in (low_band, result, high_band) if band is not None], dim=2 + axis)
    return result


def _band(source: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, outputs: list[Range],
          windows: Sequence[AxisWindow | None], stride: tuple[int, int], reach: tuple[int, int],
          padding: tuple[int, int], dilation: tuple[int, int], groups: int, from_tile: bool = False) -> torch.Tensor:
    """The output rows/columns ``outputs`` (local indices) from ``source`` (the extended tile, or the bare tile)."""
    view = source
    for axis, window in enumerate(windows):
        if window is None:
            continue  # the whole axis, padded by the convolution itself
        (lo, hi), s = outputs[axis], stride[axis]
        offset = window.own_start - window.read_start if from_tile else 0
        view = view.narrow(2 + axis, lo * s - offset, (hi - 1) * s + reach[axis] + 1 - lo * s)
    return F.conv2d(view, weight, bias, stride, _local_padding(windows, padding), dilation, groups)


def bands_are_uniform(all_windows: Sequence[Sequence[AxisWindow] | None], tile_rows: Sequence[Sequence[int]],
                      stride: tuple[int, int], reach: tuple[int, int], padding: tuple[int, int]) -> bool:
    """Whether every tile of each split axis has an interior and the same set of non-empty border bands.

    Backward exchanges run in the order autograd's engine reaches them, and that order follows the shape of
    each rank's graph: tiles whose graphs differ (a missing band, an empty interior) could reach their
    exchanges in different orders and wait on each other forever. So the overlapped form is used only where
    every tile builds the same graph; ``all_windows[a]`` lists axis ``a``'s windows of every tile.
    """
    for axis, windows in enumerate(all_windows):
        if windows is None:
            continue
        shapes = set()
        for window, rows in zip(windows, tile_rows[axis]):
            size = _output_extent(rows, window, stride[axis], reach[axis], padding[axis])
            lo, hi = _interior(window, stride[axis], reach[axis], size)
            if lo >= hi:
                return False
            shapes.add((lo > 0, hi < size))
        if len(shapes) > 1:
            return False
    return True


def _output_extent(tile_rows: int, window: AxisWindow | None, stride: int, reach: int, padding: int) -> int:
    rows = window.read_stop - window.read_start if window is not None else tile_rows + 2 * padding
    return (rows - reach - 1) // stride + 1


def _interior(window: AxisWindow | None, stride: int, reach: int, size: int) -> Range:
    if window is None:
        return 0, size
    own_first, own_stop = window.own_start - window.read_start, window.own_stop - window.read_start
    lo = -(-own_first // stride)
    hi = (own_stop - reach - 1) // stride + 1
    return max(0, lo), max(max(0, lo), min(size, hi))


def _local_padding(windows: Sequence[AxisWindow | None], padding: tuple[int, int]) -> tuple[int, int]:
    return (0 if windows[0] is not None else padding[0], 0 if windows[1] is not None else padding[1])
