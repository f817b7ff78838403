"""Losses as users write them for the unsplit model, for ``parplan run --loss tests/small_losses.py:NAME``."""

from __future__ import annotations

import torch


def monai_dice_ce(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """MONAI's Dice + cross-entropy over softmax probabilities, labels ``(N, 1, *spatial)``."""
    from monai.losses import DiceCELoss

    return DiceCELoss(softmax=True, to_onehot_y=True)(output, target)


def tversky(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A Tversky loss in plain torch against a probability map of the output's shape."""
    probabilities = output.sigmoid()
    dims = tuple(range(2, output.dim()))
    hits = (probabilities * target).sum(dims)
    false_pos = (probabilities * (1 - target)).sum(dims)
    false_neg = ((1 - probabilities) * target).sum(dims)
    return (1 - (hits + 1) / (hits + 0.3 * false_pos + 0.7 * false_neg + 1)).mean()


def counted_by_hand(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A squared error averaged with the tile's own count (``numel``): cannot be kept split, so the output is
    gathered."""
    return (output.softmax(1) - target).square().sum() / output.numel()
