"""A small CNN with two inputs: an image and a per-sample condition vector (as a diffusion UNet takes ``t``).

``forward(x, cond)``: ``x`` is ``(N, C, H, W)``, ``cond`` is ``(N, D)``. The
condition goes through a linear layer to one bias per channel, added to the
first convolution's feature map (``h = conv(x) + lin(cond)[:, :, None, None]``);
two more convolutions (the second followed by batch-norm) and a 1×1 head
give a per-pixel class map ``(N, K, H, W)``. ``conditioned_cnn()`` is the
command line's factory; give one ``--input-shape`` per input, in order::

    parplan inspect --model examples/conditioned_cnn.py:conditioned_cnn --input-shape 4,3,32,32 --input-shape 4,8
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ConditionedCNN", "conditioned_cnn"]


class ConditionedCNN(nn.Module):
    """conv → + linear(cond) per channel → ReLU → conv → batch-norm → ReLU → 1×1 head."""

    def __init__(self, in_channels: int = 3, condition: int = 8, width: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1)
        self.lin = nn.Linear(condition, width)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.relu2 = nn.ReLU()
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.conv1(x) + self.lin(cond)[:, :, None, None]
        h = self.relu2(self.bn(self.conv2(self.relu1(h))))
        return self.head(h)


def conditioned_cnn() -> ConditionedCNN:
    """The default model: 3 image channels, an 8-value condition, width 16, 4 classes."""
    return ConditionedCNN()
