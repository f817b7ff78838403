"""Tier 3: convolution and pooling on height/width tiles equal the unsplit operation (gloo, 2 and 4 ranks).

Every rank computes the unsplit reference itself, runs its tile through
``runtime.spatial`` and compares: its output tile, its input-gradient tile,
and the weight and bias gradients summed over the tiles. Extents are chosen
so that strided windows straddle tile borders (13 rows into 2 or 4 tiles).
"""

from __future__ import annotations

import pytest
from distributed import run_ranks

CASES = (  # (operation, kwargs)
    ("conv", {"kernel": 3, "stride": 1, "padding": 1}),
    ("conv", {"kernel": 3, "stride": 2, "padding": 1}),
    ("conv", {"kernel": 5, "stride": 1, "padding": 4, "dilation": 2}),
    ("conv", {"kernel": 1, "stride": 2, "padding": 0}),
    ("conv", {"kernel": 7, "stride": 2, "padding": 3}),
    ("conv", {"kernel": 3, "stride": 1, "padding": 1, "groups": 2}),
    ("conv", {"kernel": 2, "stride": 3, "padding": 0}),
    ("maxpool", {"kernel": 3, "stride": 2, "padding": 1}),
    ("avgpool", {"kernel": 3, "stride": 1, "padding": 1}),
    ("avgpool", {"kernel": 3, "stride": 2, "padding": 1, "count_include_pad": False}),  # inception_v4's
    ("maxpool", {"kernel": 3, "stride": 2, "padding": 0, "ceil_mode": True}),  # squeezenet's: 13×14 → 6×7
    ("maxpool", {"kernel": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    ("avgpool", {"kernel": 2, "stride": 2, "padding": 0, "ceil_mode": True, "count_include_pad": False}),  # avg_down
    ("avgpool", {"kernel": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    ("avgpool", {"kernel": 2, "stride": 2, "padding": 0}),
)


def _check_tiles(rank: int, world_size: int, grids: list[tuple[int, int]], dtype_name: str,
                 extents: tuple[int, int] = (13, 14)) -> int:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from runtime.spatial import TileGrid, avg_pool2d, conv2d, max_pool2d

    dtype = getattr(torch, dtype_name)
    checked = refused = 0
    for h, w in grids:
        grid = TileGrid.of_rank((h, w), list(range(world_size)), rank)
        for operation, kw in CASES:
            generator = torch.Generator().manual_seed(1000 * h + 10 * w + checked)
            x = torch.randn(2, 4, *extents, dtype=dtype, generator=generator, requires_grad=True)
            weight = torch.randn(6, 4 // kw.get("groups", 1), kw["kernel"], kw["kernel"], dtype=dtype,
                                 generator=generator, requires_grad=True)
            bias = torch.randn(6, dtype=dtype, generator=generator, requires_grad=True)
            conv_args = dict(stride=kw["stride"], padding=kw["padding"], dilation=kw.get("dilation", 1),
                             groups=kw.get("groups", 1))
            if operation == "conv":
                reference = F.conv2d(x, weight, bias, **conv_args)
            elif operation == "maxpool":
                reference = F.max_pool2d(x, kw["kernel"], kw["stride"], kw["padding"],
                                         ceil_mode=kw.get("ceil_mode", False))
            else:
                reference = F.avg_pool2d(x, kw["kernel"], kw["stride"], kw["padding"],
                                         ceil_mode=kw.get("ceil_mode", False),
                                         count_include_pad=kw.get("count_include_pad", True))
            upstream = torch.randn(reference.shape, dtype=dtype, generator=generator)
            reference.backward(upstream)

            i, j = grid.tile
            context = f"{operation} {kw} on {h}×{w} of {extents}, tile {grid.tile}"
            forms = ("joined", "bands", "superposed") if operation == "conv" else (None,)
            try:
                for form in forms:  # each form of a convolution (one falling back to the joined where it cannot)
                    tile = _tile(x.detach(), h, w, i, j).requires_grad_(True)
                    local_weight = weight.detach().clone().requires_grad_(True)
                    local_bias = bias.detach().clone().requires_grad_(True)
                    if operation == "conv":
                        out = conv2d(tile, local_weight, local_bias, grid, extents, **conv_args, form=form)
                    elif operation == "maxpool":
                        out = max_pool2d(tile, grid, extents, kw["kernel"], kw["stride"], kw["padding"],
                                         ceil_mode=kw.get("ceil_mode", False))
                    else:
                        out = avg_pool2d(tile, grid, extents, kw["kernel"], kw["stride"], kw["padding"],
                                         kw.get("count_include_pad", True), kw.get("ceil_mode", False))
                    where = f"{context}, {form or operation}"
                    torch.testing.assert_close(out, _tile(reference.detach(), h, w, i, j), msg=lambda m: f"{where}: {m}")
                    out.backward(_tile(upstream, h, w, i, j))
                    torch.testing.assert_close(tile.grad, _tile(x.grad, h, w, i, j), msg=lambda m: f"{where} dx: {m}")
                    if operation == "conv":
                        # a sum over every output position in another order: float32 needs a looser absolute tolerance
                        tolerance = {"rtol": 1e-5, "atol": 1e-4} if dtype == torch.float32 else {}
                        for mine, full in ((local_weight.grad, weight.grad), (local_bias.grad, bias.grad)):
                            dist.all_reduce(mine)
                            torch.testing.assert_close(mine, full, **tolerance, msg=lambda m: f"{where} dW: {m}")
            except ValueError:  # too fine for the window: the planner must refuse it too
                assert not _planner_accepts(h, w, kw, extents), f"runtime refused {operation} {kw} on {h}×{w}"
                refused += 1
                continue
            assert _planner_accepts(h, w, kw, extents), f"planner refuses {context} but the runtime ran it"
            checked += 1
        checked += _check_global_pool(grid, dtype)
    return checked, refused


def _check_global_pool(grid, dtype) -> int:  # noqa: ANN001
    import torch
    import torch.nn.functional as F

    from runtime.spatial import global_avg_pool2d

    generator = torch.Generator().manual_seed(11)
    x = torch.randn(2, 3, 13, 14, dtype=dtype, generator=generator, requires_grad=True)
    reference = F.adaptive_avg_pool2d(x, 1)
    upstream = torch.randn(reference.shape, dtype=dtype, generator=generator)
    reference.backward(upstream)
    i, j = grid.tile
    tile = _tile(x.detach(), grid.h, grid.w, i, j).requires_grad_(True)
    out = global_avg_pool2d(tile, (13, 14))
    torch.testing.assert_close(out, reference.detach())
    out.backward(upstream / (grid.h * grid.w))  # each rank's loss sees the whole pooled output: share it
    torch.testing.assert_close(tile.grad, _tile(x.grad, grid.h, grid.w, i, j))
    return 1


def _planner_accepts(h: int, w: int, kw: dict, extents: tuple[int, int]) -> bool:
    from cost_models.errors import InputError
    from cost_models.halo import axis_halos

    try:
        for extent, parts in zip(extents, (h, w)):
            axis_halos(extent, parts, kw["kernel"], kw["stride"], kw.get("dilation", 1), kw["padding"],
                       kw.get("ceil_mode", False))
    except InputError:
        return False
    return True


def _tile(tensor, h: int, w: int, i: int, j: int):  # noqa: ANN001, ANN202
    import torch

    return torch.tensor_split(torch.tensor_split(tensor, h, dim=2)[i], w, dim=3)[j].contiguous()


@pytest.mark.multirank
@pytest.mark.parametrize(("dtype", "extents"), [("float64", (13, 14)), ("float32", (13, 14)), ("float64", (16, 12))])
def test_tiles_on_two_ranks(dtype: str, extents: tuple[int, int]) -> None:
    """13 rows: strided windows straddle tile borders (the joined form); 16×12: every tile starts where its
    first window does (the superposed form, strided too)."""
    results = run_ranks(_check_tiles, 2, args=([(2, 1), (1, 2)], dtype, extents))
    assert results == [(2 * len(CASES) + 2, 0)] * 2


@pytest.mark.parametrize(("extent", "stride", "channels", "form"), [
    (16, 2, 4, "superposed"), (13, 1, 4, "superposed"), (13, 2, 4, "joined"),  # tiles that start off their windows
    (16, 1, 64, "joined"),  # filters outweigh the tile: a band's kernel call would cost more than the join's copy
])
def test_the_default_form_of_a_tile(extent: int, stride: int, channels: int, form: str) -> None:
    """On CPU, one split axis whose tiles start where their first windows do and outweigh the filters takes the
    superposed form; else joined — on every tile of the axis alike."""
    import torch

    from runtime.spatial import TileGrid, conv_form

    for rank in range(2):
        grid = TileGrid.of_rank((2, 1), [0, 1], rank)
        rows = len(torch.tensor_split(torch.arange(extent), 2)[rank])
        tile, weight = torch.empty(2, channels, rows, 12), torch.empty(channels, channels, 3, 3)
        chosen = conv_form(tile, weight, grid, (extent, 12), (stride, stride), (1, 1), (1, 1))
        assert chosen == form, f"tile {rank} of {extent} rows, stride {stride}, {channels} channels: {chosen}"
    volume = TileGrid.of_rank((2, 1, 1), [0, 1], 0)  # measured slower superposed: joined
    chosen = conv_form(torch.empty(2, 4, 8, 12, 12), torch.empty(4, 4, 3, 3, 3), volume, (16, 12, 12), (1,) * 3,
                       (1,) * 3, (1,) * 3)
    assert chosen == "joined"


@pytest.mark.multirank
def test_tiles_on_four_ranks_with_corners() -> None:
    results = run_ranks(_check_tiles, 4, args=([(2, 2), (4, 1)], "float64"))
    checked, refused = results[0]
    assert results == [(checked, refused)] * 4 and checked + refused == 2 * len(CASES) + 2 and checked >= len(CASES) + 7


def test_a_split_too_fine_for_the_window_is_refused() -> None:
    from runtime.halo_exchange import axis_window

    with pytest.raises(ValueError, match="too fine"):
        axis_window(8, 4, 1, kernel=7, stride=1, dilation=1, padding=3, neighbours=(0, 2))


def _check_batch_norm(rank: int, world_size: int, samples: int, dtype_name: str) -> int:
    """``samples`` sample groups × (world_size / samples) spatial tiles; synchronised and per-sample-group."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from runtime.norm import batch_norm

    dtype = getattr(torch, dtype_name)
    tiles = world_size // samples
    sample_index, tile_index = divmod(rank, tiles)
    spatial_groups = [dist.new_group(list(range(s * tiles, (s + 1) * tiles))) for s in range(samples)]
    checked = 0
    for synchronised in (True, False):
        generator = torch.Generator().manual_seed(7 + checked)
        x = torch.randn(4, 3, 11, 6, dtype=dtype, generator=generator) * 3 + 1
        weight = torch.randn(3, dtype=dtype, generator=generator)
        bias = torch.randn(3, dtype=dtype, generator=generator)
        upstream = torch.randn(x.shape, dtype=dtype, generator=generator)
        parts = torch.tensor_split(torch.arange(4), samples)
        mine = parts[sample_index]
        # the reference: batch-norm over everything, or over this rank's sample group only
        seen = torch.arange(4) if synchronised else mine
        ref_x = x[seen].clone().requires_grad_(True)
        ref_w, ref_b = weight.clone().requires_grad_(True), bias.clone().requires_grad_(True)
        ref_mean, ref_var = torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)
        reference = F.batch_norm(ref_x, ref_mean, ref_var, ref_w, ref_b, True, 0.1, 1e-5)
        reference.backward(upstream[seen])

        tile = torch.tensor_split(x[mine], tiles, dim=2)[tile_index].clone().requires_grad_(True)
        w, b = weight.clone().requires_grad_(True), bias.clone().requires_grad_(True)
        run_mean, run_var = torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)
        group = None if synchronised else spatial_groups[sample_index]
        out = batch_norm(tile, run_mean, run_var, w, b, True, 0.1, 1e-5, group)
        rows = mine.tolist() if synchronised else list(range(len(mine)))  # this rank's samples in the reference
        expected = torch.tensor_split(reference.detach()[rows], tiles, dim=2)[tile_index]
        torch.testing.assert_close(out, expected)
        out.backward(torch.tensor_split(upstream[mine], tiles, dim=2)[tile_index])
        torch.testing.assert_close(tile.grad, torch.tensor_split(ref_x.grad[rows], tiles, dim=2)[tile_index])
        for local, full in ((w.grad, ref_w.grad), (b.grad, ref_b.grad)):
            dist.all_reduce(local, group=group)
            torch.testing.assert_close(local, full)
        torch.testing.assert_close(run_mean, ref_mean)
        torch.testing.assert_close(run_var, ref_var)
        checked += 1
    return checked


@pytest.mark.multirank
@pytest.mark.parametrize(("world_size", "samples"), [(2, 1), (4, 2)])
def test_batch_norm_statistics_over_the_spatial_and_sample_groups(world_size: int, samples: int) -> None:
    assert run_ranks(_check_batch_norm, world_size, args=(samples, "float64")) == [2] * world_size


def _check_superposed_volume_and_sequence(rank: int, world_size: int) -> int:
    """The superposed form of a volume split by depth and of a sequence split by length equals the unsplit
    convolution: output, input gradient, weight and bias gradients (float64)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from runtime.spatial import TileGrid, conv2d

    checked = 0
    for shape, conv, stride in (((2, 3, 12, 6, 5), F.conv3d, 1), ((2, 3, 12, 6, 5), F.conv3d, 2),
                                ((2, 3, 16), F.conv1d, 1)):
        generator = torch.Generator().manual_seed(checked)
        x = torch.randn(shape, dtype=torch.float64, generator=generator, requires_grad=True)
        weight = torch.randn(4, 3, *([3] * (len(shape) - 2)), dtype=torch.float64, generator=generator,
                             requires_grad=True)
        bias = torch.randn(4, dtype=torch.float64, generator=generator, requires_grad=True)
        reference = conv(x, weight, bias, stride, 1)
        upstream = torch.randn(reference.shape, dtype=torch.float64, generator=generator)
        reference.backward(upstream)
        parts = (2,) + (1,) * (len(shape) - 3)
        grid = TileGrid.of_rank(parts, [0, 1], rank)
        tile = torch.tensor_split(x.detach(), 2, dim=2)[rank].contiguous().requires_grad_(True)
        mine_weight, mine_bias = weight.detach().clone().requires_grad_(True), bias.detach().clone().requires_grad_(True)
        out = conv2d(tile, mine_weight, mine_bias, grid, tuple(shape[2:]), stride, 1, form="superposed")
        torch.testing.assert_close(out, torch.tensor_split(reference.detach(), 2, dim=2)[rank], rtol=0, atol=1e-12)
        out.backward(torch.tensor_split(upstream, 2, dim=2)[rank])
        torch.testing.assert_close(tile.grad, torch.tensor_split(x.grad, 2, dim=2)[rank], rtol=0, atol=1e-12)
        for mine, full in ((mine_weight.grad, weight.grad), (mine_bias.grad, bias.grad)):
            dist.all_reduce(mine)
            torch.testing.assert_close(mine, full, rtol=0, atol=1e-11)
        checked += 1
    return checked


@pytest.mark.multirank
def test_superposed_volume_and_sequence_tiles() -> None:
    assert run_ranks(_check_superposed_volume_and_sequence, 2) == [3, 3]
