"""A 1-D CNN over long signals (ECG-, audio- or sensor-style): ``N, C, L`` sequences whose length is split.

Blocks of a width-7 convolution, batch-norm, ReLU and 2× max-pooling, whose filters double up to
``max_width``, then a global average pool and a linear classifier. The length ``L`` is the axis parplan
splits (``w`` in a layout: ``--layout n2·w2``); the tiles exchange halos as an image's columns do.

``parplan run --model examples/signal1d.py:signal_cnn --input-shape 8,2,4096 --layout w2 --nproc 2 --verify``
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SignalCNN", "signal_cnn"]


class SignalCNN(nn.Module):
    """``blocks`` convolution/pooling blocks over a sequence of ``in_channels``, a global pool, a classifier."""

    def __init__(self, in_channels: int = 2, blocks: int = 4, width: int = 16, max_width: int = 128,
                 classes: int = 5) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for block in range(blocks):
            out = min(width * 2**block, max_width)
            layers += [nn.Conv1d(channels, out, 7, padding=3, bias=False), nn.BatchNorm1d(out), nn.ReLU(),
                       nn.MaxPool1d(2)]
            channels = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(channels, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def signal_cnn() -> SignalCNN:
    """Two input channels, four blocks (16–128 filters), five classes."""
    return SignalCNN()
