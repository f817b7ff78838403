"""Swin's window attention and patch merging (torchvision's ``shifted_window_attention`` and
``_patch_merging_pad`` on ``(N, H, W, C)`` maps): which layouts the runtime splits them by.

* Window attention attends within windows of ``window_size`` (shifted by
  ``shift_size`` every other block): it splits samples, and rows and columns
  at whole windows — every tile's bounds a multiple of the window along each
  split axis, the extent too (no padding there) — with no dropout (its draws
  would differ from the unsplit call's). The shifted windows' rows come from
  the next tile and go back after (``runtime.windows``). Not its heads (c).
* Patch merging concatenates each 2×2 patch's channels: it splits samples,
  and rows and columns where every tile's bounds are even (each patch on one
  tile, each tile's output the same part of the merged map); not channels.
"""

from __future__ import annotations

from cost_models.halo import partition
from cost_models.ir.layer import Layer
from cost_models.layout import Layout

__all__ = ["merging_refusal", "window_refusal"]

_AXES = ("rows", "columns")


def window_refusal(layer: Layer, layout: Layout) -> str | None:
    """Why the runtime cannot run Swin's window attention under ``layout`` (``None``: it can)."""
    attrs = layer.attrs
    if layout.c > 1:
        return f"window attention splits samples and whole windows (h, w), not its heads ({layout})"
    if layout.spatial == 1:
        return None
    if (attrs.get("input_orders") or [""])[0] != "nhwc":
        return "window attention splits rows and columns of an (N, H, W, C) map only"
    if attrs.get("attention_dropout") or attrs.get("dropout"):
        return "window attention with dropout splits by sample only (its draws would differ from the unsplit call's)"
    shape = layer.input_shapes[0]
    for axis, (extent, parts, window) in enumerate(zip(shape[1:3], (layout.h, layout.w), attrs["window_size"])):
        if parts > 1 and (extent % window or any(start % window for start, _ in partition(extent, parts))):
            return (f"window attention splits {_AXES[axis]} at whole windows only: {extent} {_AXES[axis]} into "
                    f"{parts} parts are not multiples of its window of {window}")
    return None


def merging_refusal(layer: Layer, layout: Layout) -> str | None:
    """Why the runtime cannot run Swin's patch merging under ``layout`` (``None``: it can)."""
    if layout.c > 1:
        return "patch merging concatenates each 2×2 patch's channels: it is not split by channel"
    if layout.spatial == 1:
        return None
    if (layer.attrs.get("input_orders") or [""])[0] != "nhwc":
        return "patch merging splits rows and columns of an (N, H, W, C) map only"
    shape = layer.input_shapes[0]
    for axis, (extent, parts) in enumerate(zip(shape[1:3], (layout.h, layout.w))):
        halves = [(start // 2, stop // 2) for start, stop in partition(extent, parts)]
        if parts > 1 and (extent % 2 or halves != partition(extent // 2, parts)
                          or any(start % 2 for start, _ in partition(extent, parts))):
            return (f"patch merging splits {_AXES[axis]} where every tile holds whole 2×2 patches only: {extent} "
                    f"{_AXES[axis]} into {parts} parts are not")
    return None
