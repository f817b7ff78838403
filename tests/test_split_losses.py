"""Losses as users train with them, taken of a split output: MONAI's Dice family, a Dice written by hand,
``mse_loss`` and a weighted cross-entropy with ignored labels give the unsplit model's loss and every gradient
through :meth:`DistributedModel.loss` — kept split, the output never gathered — and through
:meth:`DistributedModel.gather` (every rank taking the loss of the whole output); a loss that cannot be kept
split (a count from a tile's shape) is taken of the gathered output.

float64, against the unsplit model, under sample, row, column, channel and mixed row/column splits of a 2-D
UNet and depth splits of a 3-D UNet and of MONAI's; on 4 ranks, rows × columns and samples × rows of the UNet
and depth × rows of the 3-D one. The estimate's price of a recorded loss is checked last.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from distributed import run_ranks
from runtime_check import assert_split_matches, uniform_test_plan
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from unet import UNet  # noqa: E402
from unet3d import UNet3d  # noqa: E402

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
SHAPES = {"unet": (2, 3, 16, 16), "unet3d": (2, 1, 8, 8, 8), "monai3d": (2, 1, 8, 8, 8)}


def own_dice(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A soft Dice loss as a user writes one for the unsplit model."""
    probabilities = output.softmax(dim=1)
    onehot = F.one_hot(target[:, 0], output.shape[1]).movedim(-1, 1).to(output.dtype)
    dims = tuple(range(2, output.dim()))
    overlap = (probabilities * onehot).sum(dims)
    total = probabilities.sum(dims) + onehot.sum(dims)
    return 1 - ((2 * overlap + 1e-5) / (total + 1e-5)).mean()


def counted_by_hand(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A mean taken with the tile's own count: cannot be kept split, so the output is gathered."""
    return (output.softmax(1)[:, :1] - target).square().sum() / output[:, :1].numel()


def _losses() -> dict[str, Loss]:
    from monai.losses import DiceCELoss, DiceLoss, GeneralizedDiceLoss, TverskyLoss

    weight = torch.tensor([1.0, 3.0], dtype=torch.float64)
    return {
        "DiceLoss": DiceLoss(softmax=True, to_onehot_y=True),
        "DiceLoss batch": DiceLoss(softmax=True, to_onehot_y=True, batch=True, include_background=False),
        "DiceCELoss": DiceCELoss(softmax=True, to_onehot_y=True),
        "TverskyLoss": TverskyLoss(softmax=True, to_onehot_y=True, alpha=0.3, beta=0.7),
        "GeneralizedDiceLoss": GeneralizedDiceLoss(softmax=True, to_onehot_y=True),
        "GeneralizedDiceLoss batch": GeneralizedDiceLoss(sigmoid=True, to_onehot_y=True, batch=True),
        "own Dice": own_dice,
        "mse_loss": lambda out, target: F.mse_loss(out[:, :1], target.to(out.dtype)),
        "cross_entropy weighted": lambda out, target: F.cross_entropy(out, target[:, 0], weight=weight,
                                                                      ignore_index=1),
    }


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "monai3d":
        from monai.networks.nets import UNet as MonaiUNet

        return MonaiUNet(3, 1, 2, channels=(4, 8), strides=(2,), num_res_units=1).to(torch.float64)
    model = UNet(width=4, depth=2) if name == "unet" else UNet3d(width=2, depth=2)
    return model.to(torch.float64)


def _check(rank: int, name: str, layouts: str, losses: dict[str, Loss], world: int, *,
           gather: bool = False) -> list[str]:
    from cost_models.ir.tracing import trace
    from runtime.apply import apply_plan

    shape = SHAPES[name]
    graph = trace(_model(name), shape, torch.float64)
    plan = uniform_test_plan(graph, world, layouts.split(","))
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(shape, dtype=torch.float64, generator=generator)
    target = torch.randint(0, 2, (shape[0], 1, *shape[2:]), generator=generator)
    gathered = []
    for loss_name, loss_fn in losses.items():
        split, reference = apply_plan(_model(name), plan, graph=graph, sync_batchnorm=True), _model(name)
        out = split(split.shard(x))
        if gather:  # every rank takes the loss of the whole output; shares: its value over the ranks
            share = loss_fn(split.gather(out), target)
            share.backward()
            share = share.detach() / world
        else:
            share = split.loss(out, target[split.target_box(tuple(target.shape))], loss_fn)
            share.backward()
        expected = reference(x)
        expected_loss = loss_fn(expected, target)
        expected_loss.backward()
        context = f"{loss_name}, {name} {layouts} ({plan.summary()}) on rank {rank}"
        torch.testing.assert_close(split.global_value(share), expected_loss.item(), rtol=1e-9, atol=0,
                                   msg=lambda m: f"{context} loss: {m}")
        assert_split_matches(split, reference, out, expected, context)
        if split.losses_taken_whole:
            gathered.append(loss_name)
    return gathered


TWO_RANKS = (("unet", "n2"), ("unet", "h2"), ("unet", "w2"), ("unet", "c2"), ("unet", "h2,w2"), ("unet3d", "d2"),
             ("monai3d", "d2"), ("monai3d", "n2"))
FOUR_RANKS = (("unet", "n2·h2"), ("unet", "h2·w2"), ("unet3d", "d2·h2"))


def _cases(rank: int, world: int) -> dict[str, list[str]]:
    losses = _losses()
    if world == 4:  # a few, to keep four ranks on a small machine short
        losses = {name: losses[name] for name in ("DiceLoss", "DiceCELoss", "own Dice", "mse_loss")}
    losses["counted by hand"] = counted_by_hand
    done = {f"{name} {layouts}": _check(rank, name, layouts, losses, world)
            for name, layouts in (TWO_RANKS if world == 2 else FOUR_RANKS)}
    losses.pop("counted by hand")  # the same losses through gather: the whole output on every rank
    for name, layouts in (("unet", "h2,w2"), ("monai3d", "d2")) if world == 2 else (("unet", "h2·w2"),):
        assert not _check(rank, name, layouts, losses, world, gather=True)
    return done


@pytest.mark.multirank
@pytest.mark.parametrize("world", [2, 4])
def test_losses_kept_split_give_the_unsplit_loss_and_gradients(world: int) -> None:
    done: Any = run_ranks(_cases, world, timeout_s=600)[0]
    for case, gathered in done.items():  # c2: the loss sees the whole output on each rank, nothing split
        assert gathered == ([] if case.endswith("c2") else ["counted by hand"]), (case, gathered)


def test_the_estimate_prices_a_recorded_loss_on_the_stage_that_takes_it() -> None:
    """``--loss`` records what the loss moves, keeps and sums (``runtime.losses.loss_cost``); the estimate adds
    it to the last stage: its seconds (``breakdown_s["loss"]``), the bytes it keeps, and the allreduces of a
    Dice loss's sums only where the output is split (``cost_models.loss_cost``)."""
    from cost_models.estimate import estimate
    from cost_models.ir.tracing import trace
    from parplan.api import load_profile
    from runtime.losses import loss_cost

    graph = trace(_model("unet").float(), (4, 3, 32, 32), torch.float32)
    profile = load_profile("v100")
    output = tuple(graph.nodes[graph.graph["outputs"][0]].output_shape)
    for layouts in (["n1"], ["h2"]):
        plan = uniform_test_plan(graph, 1 if layouts == ["n1"] else 2, layouts)
        graph.graph.pop("loss", None)
        plain = estimate(graph, plan, profile)
        graph.graph["loss"] = loss_cost("dice", output, torch.float32, "classes").to_dict()
        priced = estimate(graph, plan, profile)
        assert priced.breakdown_s["loss"] > 0 and "loss" not in plain.breakdown_s
        assert priced.iteration_s == pytest.approx(plain.iteration_s + priced.breakdown_s["loss"], rel=1e-6)
        assert priced.memory_bytes_max > plain.memory_bytes_max
    cost = loss_cost("dice", output, torch.float32, "classes")
    assert cost.global_sums == 3 and loss_cost("ce", output, torch.float32, "classes").global_sums == 0
