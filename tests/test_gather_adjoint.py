"""``DistributedModel.gather`` is a replicated value: a loss every rank takes whole of the gathered output (a Dice
loss, which is not a mean of per-position terms) trains the split model exactly as the unsplit one.

The adjoint of a gather is each rank's own box of the whole gradient (PyTorch's DTensor ``Shard → Replicate``),
not the sum over the ranks of their copies' gradients: that sum counted the gradient once per rank (every
parameter gradient 2× the unsplit model's on 2 ranks, silently). Checked in float64 — output, loss and every
parameter gradient against the unsplit model — under sample, row, column, channel and depth splits, and a
plan that mixes rows and columns from layer to layer.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from distributed import run_ranks
from runtime_check import assert_split_matches, uniform_test_plan

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from unet import UNet  # noqa: E402
from unet3d import UNet3d  # noqa: E402

CASES = (("unet", "n2"), ("unet", "h2"), ("unet", "w2"), ("unet", "c2"), ("unet", "h2,w2"), ("unet3d", "d2"))
SHAPES = {"unet": (2, 3, 16, 16), "unet3d": (2, 1, 8, 8, 8)}


def dice_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A soft Dice loss as a user writes one: softmax over classes, one-hot labels, a ratio of global sums."""
    probabilities = output.softmax(dim=1)
    onehot = torch.nn.functional.one_hot(target, output.shape[1]).movedim(-1, 1).to(output.dtype)
    dims = tuple(range(2, output.dim()))
    overlap = (probabilities * onehot).sum(dims)
    total = probabilities.sum(dims) + onehot.sum(dims)
    return 1 - ((2 * overlap + 1e-5) / (total + 1e-5)).mean()


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = UNet(width=4, depth=2) if name == "unet" else UNet3d(width=2, depth=2)
    return model.to(torch.float64)


def _cases(rank: int, world: int) -> dict[str, str]:
    from cost_models.ir.tracing import trace
    from runtime.apply import apply_plan

    done = {}
    for name, layouts in CASES:
        shape = SHAPES[name]
        graph = trace(_model(name), shape, torch.float64)
        plan = uniform_test_plan(graph, world, layouts.split(","))
        split, reference = apply_plan(_model(name), plan, graph=graph, sync_batchnorm=True), _model(name)
        generator = torch.Generator().manual_seed(3)
        x = torch.randn(shape, dtype=torch.float64, generator=generator)
        target = torch.randint(0, 2, (shape[0], *shape[2:]), generator=generator)
        out = split(split.shard(x))
        loss = dice_loss(split.gather(out), target)  # every rank: the whole output's loss
        loss.backward()
        expected = reference(x)
        expected_loss = dice_loss(expected, target)
        expected_loss.backward()
        context = f"{name} {layouts} ({plan.summary()}) on rank {rank}"
        torch.testing.assert_close(loss, expected_loss, msg=lambda m: f"{context} loss: {m}")
        assert_split_matches(split, reference, out, expected, context)
        done[f"{name} {layouts}"] = plan.summary()
    return done


@pytest.mark.multirank
def test_a_loss_of_the_gathered_output_gives_the_unsplit_gradients() -> None:
    done: Any = run_ranks(_cases, 2, timeout_s=400)[0]
    assert len(done) == len(CASES)
    assert all(summary != "n1" for summary in done.values()), done  # each plan splits some layer
