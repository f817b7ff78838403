"""A UNet-style segmentation network: the large-sample CNN shape parplan is built for.

Encoder of double 3×3 convolutions with max-pooling, a bottleneck, and a
decoder that upsamples (transposed convolution on even levels, bilinear
``nn.Upsample`` followed by a 1×1 convolution on odd ones) and concatenates
the encoder's skip tensor. ``unet()`` is the factory the command line uses:
``parplan inspect --model examples/unet.py:unet --input-shape 2,3,256,256``.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["UNet", "unet"]


def double_conv(in_channels: int, out_channels: int) -> nn.Sequential:
    """Two 3×3 convolutions, each followed by batch-norm and ReLU."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
        nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class Up(nn.Module):
    """Upsample by 2, concatenate the skip tensor, then a double convolution."""

    def __init__(self, in_channels: int, out_channels: int, transposed: bool) -> None:
        super().__init__()
        if transposed:
            self.up: nn.Module = nn.ConvTranspose2d(in_channels, out_channels, kernel_size=2, stride=2)
        else:
            self.up = nn.Sequential(
                nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
                nn.Conv2d(in_channels, out_channels, kernel_size=1),
            )
        self.conv = double_conv(2 * out_channels, out_channels)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([skip, self.up(x)], dim=1))


class UNet(nn.Module):
    """UNet with ``depth`` down/up levels starting at ``width`` channels."""

    def __init__(self, in_channels: int = 3, classes: int = 2, width: int = 16, depth: int = 3) -> None:
        super().__init__()
        channels = [width * 2**level for level in range(depth + 1)]
        self.inc = double_conv(in_channels, channels[0])
        self.pool = nn.MaxPool2d(2)
        self.downs = nn.ModuleList(double_conv(channels[i], channels[i + 1]) for i in range(depth))
        self.ups = nn.ModuleList(
            Up(channels[i + 1], channels[i], transposed=(i % 2 == 0)) for i in reversed(range(depth))
        )
        self.head = nn.Conv2d(channels[0], classes, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.inc(x)]
        for down in self.downs:
            skips.append(down(self.pool(skips[-1])))
        x = skips.pop()
        for up in self.ups:
            x = up(x, skips.pop())
        return self.head(x)


def unet() -> UNet:
    """The default UNet (3 input channels, 2 classes, width 16, depth 3)."""
    return UNet()
