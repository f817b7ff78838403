"""Tier 3: filter-split convolution and linear layers equal the unsplit ones (gloo, 2 and 4 ranks)."""

from __future__ import annotations

import pytest

from distributed import run_ranks


def _check_filter_split(rank: int, world_size: int) -> int:
    import torch
    import torch.nn.functional as F

    from runtime.channel import conv2d_filter_slice, filter_slice, linear_filter_slice

    generator = torch.Generator().manual_seed(5)
    checked = 0
    for kind in ("conv", "linear"):
        x = torch.randn(3, 8, 9, 7, dtype=torch.float64, generator=generator) if kind == "conv" else \
            torch.randn(3, 8, dtype=torch.float64, generator=generator)
        weight = torch.randn((7, 8, 3, 3) if kind == "conv" else (7, 8), dtype=torch.float64, generator=generator)
        bias = torch.randn(7, dtype=torch.float64, generator=generator)
        ref_x, ref_w, ref_b = (t.clone().requires_grad_(True) for t in (x, weight, bias))
        reference = F.conv2d(ref_x, ref_w, ref_b, stride=2, padding=1) if kind == "conv" else F.linear(ref_x, ref_w, ref_b)
        upstream = torch.randn(reference.shape, dtype=torch.float64, generator=generator)
        reference.backward(upstream)

        mine = filter_slice(7, world_size, rank)  # 7 filters: uneven slices
        local_x = x.clone().requires_grad_(True)
        local_w = weight[mine].clone().requires_grad_(True)
        local_b = bias[mine].clone().requires_grad_(True)
        if kind == "conv":
            out = conv2d_filter_slice(local_x, local_w, local_b, None, stride=2, padding=1)
        else:
            out = linear_filter_slice(local_x, local_w, local_b, None)
        torch.testing.assert_close(out, reference.detach()[:, mine])
        out.backward(upstream[:, mine])
        torch.testing.assert_close(local_x.grad, ref_x.grad)
        torch.testing.assert_close(local_w.grad, ref_w.grad[mine])
        torch.testing.assert_close(local_b.grad, ref_b.grad[mine])
        checked += 1
    return checked


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", [2, 4])
def test_filter_split_equals_the_unsplit_layer(world_size: int) -> None:
    assert run_ranks(_check_filter_split, world_size) == [2] * world_size
