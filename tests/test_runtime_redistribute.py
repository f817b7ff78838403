"""Tier 3: redistribution between layouts moves exactly the right elements, forward and backward (gloo)."""

from __future__ import annotations

import pytest
from distributed import run_ranks

LAYOUTS = {2: ("n2", "c2", "h2", "w2"), 4: ("n4", "h4", "w4", "n2·h2", "h2·w2", "n2·c2", "c2·w2", "c4")}


def _check_all_pairs(rank: int, world_size: int) -> int:
    import torch

    from cost_models.layout import Layout
    from cost_models.redistribution import rank_box
    from runtime.redistribute import redistribute

    shape = (4, 6, 11, 9)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(shape, dtype=torch.float64, generator=generator)
    upstream = torch.randn(shape, dtype=torch.float64, generator=generator)
    checked = 0
    for source_text in LAYOUTS[world_size]:
        for target_text in LAYOUTS[world_size]:
            source, target = Layout.parse(source_text), Layout.parse(target_text)
            local = _box(x, rank_box(shape, source, rank)).clone().requires_grad_(True)
            out = redistribute(local, shape, source, target, list(range(world_size)))
            torch.testing.assert_close(out, _box(x, rank_box(shape, target, rank)))
            out.backward(_box(upstream, rank_box(shape, target, rank)))
            torch.testing.assert_close(local.grad, _box(upstream, rank_box(shape, source, rank)))
            checked += 1
    for source_text, target_text in (("n2", "h4"), ("h4", "n1"), ("n1", "n2·w2"), ("c2", "w2")):  # with copies
        source, target = Layout.parse(source_text), Layout.parse(target_text)
        if world_size % source.ranks or world_size % target.ranks:
            continue
        out = redistribute(_box(x, rank_box(shape, source, rank)), shape, source, target, list(range(world_size)))
        torch.testing.assert_close(out, _box(x, rank_box(shape, target, rank)))
        checked += 1
    return checked


def _box(tensor, box):  # noqa: ANN001, ANN202
    view = tensor
    for dim, (lo, hi) in enumerate(box):
        view = view.narrow(dim, lo, hi - lo)
    return view.contiguous()


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", [2, 4])
def test_every_pair_of_layouts(world_size: int) -> None:
    count = len(LAYOUTS[world_size]) ** 2 + (4 if world_size == 4 else 1)
    assert run_ranks(_check_all_pairs, world_size) == [count] * world_size
