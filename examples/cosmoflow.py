"""A CosmoFlow-style 3-D CNN: cosmological parameters regressed from a dark-matter density volume.

After Mathuriya et al. (SC 2018) and the MLPerf HPC reference: four input channels (the redshifts of one
simulation), blocks of a 3×3×3 convolution, leaky ReLU and 2×2×2 max-pooling whose filters double up to
``max_width``, then dense layers to the four parameters, squashed by tanh. Oyama et al. (TPDS 2021) trained
it on whole 512³ volumes with hybrid sample × spatial parallelism; the number of blocks sets the size it is
built for (``size / 2**blocks`` voxels a side reach the dense head).

``parplan inspect --model examples/cosmoflow.py:cosmoflow --input-shape 2,4,64,64,64`` (64³: four blocks);
``examples/cosmoflow.py:cosmoflow512`` is the 512³ network (seven blocks).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["CosmoFlow", "cosmoflow", "cosmoflow512"]


class CosmoFlow(nn.Module):
    """``blocks`` convolution/pooling blocks on a ``size``³ volume of ``in_channels``, then a dense head."""

    def __init__(self, size: int = 64, blocks: int = 4, in_channels: int = 4, width: int = 16,
                 max_width: int = 256, outputs: int = 4) -> None:
        super().__init__()
        if size % 2**blocks:
            raise ValueError(f"a {size}³ volume cannot be pooled by 2 {blocks} times; use a multiple of {2**blocks}")
        layers: list[nn.Module] = []
        channels = in_channels
        for block in range(blocks):
            out = min(width * 2**block, max_width)
            layers += [nn.Conv3d(channels, out, 3, padding=1), nn.LeakyReLU(0.2), nn.MaxPool3d(2)]
            channels = out
        self.features = nn.Sequential(*layers)
        side = size // 2**blocks
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(channels * side**3, 128), nn.LeakyReLU(0.2),
                                  nn.Linear(128, 64), nn.LeakyReLU(0.2), nn.Linear(64, outputs), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def cosmoflow() -> CosmoFlow:
    """The 64³ network: four blocks (16–128 filters), 4³ voxels into the dense head."""
    return CosmoFlow(size=64, blocks=4)


def cosmoflow512() -> CosmoFlow:
    """The 512³ network: seven blocks (16–256 filters), 4³ voxels into the dense head."""
    return CosmoFlow(size=512, blocks=7)
