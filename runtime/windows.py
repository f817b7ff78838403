"""Swin's shifted-window attention on a tile of whole windows: torchvision's ``shifted_window_attention`` split by
rows and columns, equal to the unsplit call.

A tile owns whole windows (its bounds multiples of the window along each split
axis: ``cost_models.capability.windows``). The unsplit call pads the map to whole
windows, rolls it by ``−shift``, attends within each window — masking, in the
windows that wrap around, pairs of rows that came from different bands of the
map — and rolls back by ``shift``. On a tile, along each split axis:

* the rolled tile is the input's rows ``[start + shift, stop + shift)``
  (modulo the extent): its own but the first ``shift`` and the next tile's
  first ``shift`` (the last tile: the first tile's), gathered circularly
  (``runtime.borders.gather_axis``; backward returns their gradients);
* it attends within its windows, the mask's bands from each row's global
  position (only the last tile's last window wraps);
* its output rows ``[start, stop)`` are the attended rows ``[start − shift,
  stop − shift)``: its own but the last ``shift`` and the previous tile's
  last ``shift``, gathered the same way.

Unsplit axes are padded, rolled and cropped locally, as the call does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from cost_models.halo import partition
from runtime.borders import axis_gather, gather_axis
from runtime.spatial import TileGrid

__all__ = ["window_attention"]

_ARGUMENTS = ("input", "qkv_weight", "proj_weight", "relative_position_bias", "window_size", "num_heads",
              "shift_size", "attention_dropout", "dropout", "qkv_bias", "proj_bias", "logit_scale", "training")
_DEFAULTS = {"attention_dropout": 0.0, "dropout": 0.0, "qkv_bias": None, "proj_bias": None, "logit_scale": None,
             "training": True}


def window_attention(grid: TileGrid, extents: Sequence[int], args: Sequence[object],
                     kwargs: Mapping[str, object]) -> torch.Tensor:
    """This tile's output of ``shifted_window_attention(*args, **kwargs)`` over a map of ``extents`` ``(H, W)``
    split by ``grid`` (its input: the tile, ``(N, h, w, C)``)."""
    call: dict[str, Any] = {**_DEFAULTS, **dict(zip(_ARGUMENTS, args)), **kwargs}  # the program's arguments by name
    window = list(call["window_size"])
    padded = [extent + (-extent) % size for extent, size in zip(extents, window)]
    shift = [0 if size >= extent else step for size, extent, step in zip(window, padded, call["shift_size"])]
    x = call["input"]
    local = [x.shape[1 + axis] for axis in range(2)]
    pads = [0 if grid.parts[axis] > 1 else padded[axis] - extents[axis] for axis in range(2)]
    x = F.pad(x, (0, 0, 0, pads[1], 0, pads[0]))
    for axis in range(2):
        x = _rolled(x, grid, padded, axis, shift[axis])
    starts = [partition(padded[axis], grid.parts[axis])[grid.tile[axis]][0] for axis in range(2)]
    out = _attend(x, call, window, shift, starts, padded)
    for axis in range(2):
        out = _rolled(out, grid, padded, axis, -shift[axis])
    return out[:, :local[0], :local[1], :].contiguous()


def _rolled(x: torch.Tensor, grid: TileGrid, extents: Sequence[int], axis: int, shift: int) -> torch.Tensor:
    """This tile of ``torch.roll(map, −shift, dim=1 + axis)``: the map's rows ``[start + shift, stop + shift)``."""
    if shift == 0:
        return x
    if grid.parts[axis] == 1:
        return torch.roll(x, -shift, dims=1 + axis)
    reads = tuple((start + shift, stop + shift) for start, stop in partition(extents[axis], grid.parts[axis]))
    return gather_axis(x, axis_gather(extents[axis], reads, grid.tile[axis], grid.axis_ranks(axis), "circular",
                                      1 + axis))


def _attend(x: torch.Tensor, call: dict[str, Any], window: list[int], shift: list[int], starts: list[int],
            extents: list[int]) -> torch.Tensor:
    """torchvision's attention within the windows of the rolled tile ``x`` (its first row and column at ``starts``
    of the rolled map of ``extents``), the same operations in the same order."""
    batch, rows, cols, channels = x.shape
    heads, across, down = call["num_heads"], rows // window[0], cols // window[1]
    tokens = window[0] * window[1]
    x = x.view(batch, across, window[0], down, window[1], channels).permute(0, 1, 3, 2, 4, 5).reshape(
        batch * across * down, tokens, channels)
    qkv_bias, logit_scale = call["qkv_bias"], call["logit_scale"]
    if logit_scale is not None and qkv_bias is not None:
        qkv_bias = qkv_bias.clone()
        length = qkv_bias.numel() // 3
        qkv_bias[length: 2 * length].zero_()
    qkv = F.linear(x, call["qkv_weight"], qkv_bias)
    q, k, v = qkv.reshape(x.size(0), tokens, 3, heads, channels // heads).permute(2, 0, 3, 1, 4)
    if logit_scale is not None:
        attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        attn = attn * torch.clamp(logit_scale, max=math.log(100.0)).exp()
    else:
        attn = (q * (channels // heads) ** -0.5).matmul(k.transpose(-2, -1))
    attn = attn + call["relative_position_bias"]
    if sum(shift) > 0:
        mask = _mask(x, window, shift, starts, extents, (rows, cols))
        attn = (attn.view(batch, across * down, heads, tokens, tokens) + mask.unsqueeze(1).unsqueeze(0)).view(
            -1, heads, tokens, tokens)
    attn = F.dropout(F.softmax(attn, dim=-1), p=call["attention_dropout"], training=call["training"])
    out = attn.matmul(v).transpose(1, 2).reshape(x.size(0), tokens, channels)
    out = F.dropout(F.linear(out, call["proj_weight"], call["proj_bias"]), p=call["dropout"], training=call["training"])
    return out.view(batch, across, down, window[0], window[1], channels).permute(0, 1, 3, 2, 4, 5).reshape(
        batch, rows, cols, channels)


def _mask(like: torch.Tensor, window: list[int], shift: list[int], starts: list[int], extents: list[int],
          size: tuple[int, int]) -> torch.Tensor:
    """``−100`` between tokens of a window from different bands of the rolled map (torchvision's mask), ``0``
    elsewhere; ``(windows, tokens, tokens)``."""
    bands = [_bands(starts[axis], size[axis], extents[axis], window[axis], shift[axis], like) for axis in range(2)]
    labels = bands[0][:, None] * 3 + bands[1][None, :]
    labels = labels.view(size[0] // window[0], window[0], size[1] // window[1], window[1]).permute(0, 2, 1, 3)
    labels = labels.reshape(-1, window[0] * window[1])
    mask = labels.unsqueeze(1) - labels.unsqueeze(2)
    return mask.masked_fill(mask != 0, (-100.0)).masked_fill(mask == 0, 0.0)


def _bands(start: int, size: int, extent: int, window: int, shift: int, like: torch.Tensor) -> torch.Tensor:
    """Each row's band of the rolled map (rows ``start … start + size − 1``): 0 before the last window, 1 in it
    before the last ``shift`` rows, 2 in those; one band throughout when the axis is not shifted."""
    rows = torch.arange(start, start + size, device=like.device)
    if shift == 0:
        return torch.full((size,), 2, dtype=like.dtype, device=like.device)
    return ((rows >= extent - window).to(like.dtype) + (rows >= extent - shift).to(like.dtype))
