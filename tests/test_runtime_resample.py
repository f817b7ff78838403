"""Tier 3: upsampling, transposed convolution and adaptive average pooling on height/width tiles equal the unsplit
operation (gloo).

Extents of 13 and 7 rows split into 2 or 4 tiles are uneven, so a tile's
output rows are not the image of its input rows and halos cross the borders.
"""

from __future__ import annotations

import pytest
from distributed import run_ranks

CASES = (  # (operation, kwargs)
    ("nearest", {"scale": 2}),
    ("bilinear", {"scale": 2}),
    ("nearest", {"scale": 3}),
    ("transpose", {"kernel": 2, "stride": 2, "padding": 0}),
    ("transpose", {"kernel": 3, "stride": 2, "padding": 1, "output_padding": 1}),
    ("transpose", {"kernel": 3, "stride": 1, "padding": 1}),
    ("transpose", {"kernel": 1, "stride": 2, "padding": 0}),
    ("adaptive", {"size": (5, 3)}),  # windows straddle tiles and overlap (13 rows to 5, 7 columns to 3)
    ("adaptive", {"size": (26, 9)}),  # more outputs than inputs: rows repeat (googlenet's aux head: 2×2 to 4×4)
    ("bilinear", {"scale": 4, "rows": 1}),  # fewer input rows than tiles: read whole (deeplabv3's pooled branch)
    ("nearest", {"scale": 2, "rows": 3}),  # 3 rows: whole under 4 tiles, halos under 2
    ("adaptive", {"size": (4, 3), "rows": 1}),
    ("adaptive", {"size": (6, 6), "rows": 1}),  # alexnet at 64: its 1×1 map pooled to 6×6
)


def _check(rank: int, world_size: int, grids: list[tuple[int, int]], dtype_name: str) -> int:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from runtime.resample import adaptive_avg_pool2d, conv_transpose2d, interpolate
    from runtime.spatial import TileGrid

    dtype = getattr(torch, dtype_name)
    checked = 0
    for h, w in grids:
        grid = TileGrid.of_rank((h, w), list(range(world_size)), rank)
        for index, (operation, kw) in enumerate(CASES):
            generator = torch.Generator().manual_seed(100 * h + 10 * w + index)
            rows = kw.get("rows", 13)
            x = torch.randn(2, 4, rows, 7, dtype=dtype, generator=generator, requires_grad=True)
            whole = (rows < h, False)
            weight = torch.randn(4, 3, kw.get("kernel", 1), kw.get("kernel", 1), dtype=dtype, generator=generator,
                                 requires_grad=True)
            bias = torch.randn(3, dtype=dtype, generator=generator, requires_grad=True)
            conv = {key: kw.get(key, 0) for key in ("stride", "padding", "output_padding")}
            if operation == "transpose":
                reference = F.conv_transpose2d(x, weight, bias, **conv)
            elif operation == "adaptive":
                reference = F.adaptive_avg_pool2d(x, kw["size"])
            else:
                reference = F.interpolate(x, scale_factor=kw["scale"], mode=operation,
                                          align_corners=False if operation == "bilinear" else None)
            upstream = torch.randn(reference.shape, dtype=dtype, generator=generator)
            reference.backward(upstream)
            i, j = grid.tile
            tile = _tile(x.detach(), 1 if whole[0] else h, w, 0 if whole[0] else i, j).requires_grad_(True)
            local_weight, local_bias = (t.detach().clone().requires_grad_(True) for t in (weight, bias))
            if operation == "transpose":
                out = conv_transpose2d(tile, local_weight, local_bias, grid, (13, 7), **conv)
            elif operation == "adaptive":
                out = adaptive_avg_pool2d(tile, grid, (rows, 7), kw["size"], whole)
            else:
                out = interpolate(tile, grid, (rows, 7), (kw["scale"], kw["scale"]), operation, whole)
            context = f"{operation} {kw} on {h}×{w}, tile {grid.tile}"
            torch.testing.assert_close(out, _tile(reference.detach(), h, w, i, j), msg=lambda m: f"{context}: {m}")
            out.backward(_tile(upstream, h, w, i, j))
            if whole[0]:  # every tile read a part of the whole input: the parts' gradients sum to x's
                dist.all_reduce(tile.grad, group=_column_group(grid, w, j))
            expected = _tile(x.grad, 1 if whole[0] else h, w, 0 if whole[0] else i, j)
            torch.testing.assert_close(tile.grad, expected, msg=lambda m: f"{context} dx: {m}")
            if operation == "transpose":
                for mine, full in ((local_weight.grad, weight.grad), (local_bias.grad, bias.grad)):
                    dist.all_reduce(mine)
                    torch.testing.assert_close(mine, full, msg=lambda m: f"{context} dW: {m}")
            checked += 1
    return checked


def _column_group(grid, w: int, j: int):  # noqa: ANN001, ANN202 - the ranks of the tiles in column j (one new group)
    import torch.distributed as dist

    groups = [dist.new_group([r for r in range(dist.get_world_size()) if r % w == column]) for column in range(w)]
    return groups[j]


def _tile(tensor, h: int, w: int, i: int, j: int):  # noqa: ANN001, ANN202
    import torch

    return torch.tensor_split(torch.tensor_split(tensor, h, dim=2)[i], w, dim=3)[j].contiguous()


@pytest.mark.multirank
def test_resampling_on_two_ranks() -> None:
    assert run_ranks(_check, 2, args=([(2, 1), (1, 2)], "float64")) == [2 * len(CASES)] * 2


@pytest.mark.multirank
def test_resampling_on_four_ranks_with_corners() -> None:
    assert run_ranks(_check, 4, args=([(2, 2), (4, 1)], "float64")) == [2 * len(CASES)] * 4
