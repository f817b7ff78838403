"""A small CNN for scikit-learn's 8×8 digits: the model of ``benchmarks/staleness_convergence.py``.

Three 3×3 convolution blocks (the second one pooled to 4×4) and a linear
classifier, with a residual connection around the third block, so that a cut
inside it sends a skip tensor. ``digits_cnn()`` is the command line's factory:
``parplan inspect --model examples/digits_cnn.py:digits_cnn --input-shape 32,1,8,8``.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DigitsCNN", "digits_cnn"]


class DigitsCNN(nn.Module):
    """conv 16 → conv 32 → max-pool → conv 32 (+ residual) → linear 10."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1)
        self.relu3 = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(32 * 4 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu2(self.conv2(self.relu1(self.conv1(x)))))
        x = x + self.relu3(self.conv3(x))
        return self.fc(self.flatten(x))


def digits_cnn() -> DigitsCNN:
    """The benchmark's CNN with PyTorch's default initialisation (seed it before calling)."""
    return DigitsCNN()
