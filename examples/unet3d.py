"""A 3D U-Net (Çiçek et al., MICCAI 2016) for volumetric segmentation.

Encoder levels of two 3×3×3 convolutions, batch-norm and ReLU with 2×2×2 max-pooling; a decoder that
upsamples with 2×2×2 transposed convolutions of stride 2 and concatenates the encoder's skip tensor; a
1×1×1 convolution to the classes. Convolutions are padded ("same"), so the output has the input's extent.

``parplan inspect --model examples/unet3d.py:unet3d --input-shape 1,1,64,64,64``.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["UNet3d", "unet3d"]


def double_conv3d(in_channels: int, out_channels: int) -> nn.Sequential:
    """Two 3×3×3 convolutions, each followed by batch-norm and ReLU."""
    return nn.Sequential(
        nn.Conv3d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm3d(out_channels),
        nn.ReLU(inplace=True),
        nn.Conv3d(out_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm3d(out_channels),
        nn.ReLU(inplace=True),
    )


class Up3d(nn.Module):
    """A transposed convolution doubling each extent, the skip tensor concatenated, a double convolution."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose3d(in_channels, out_channels, kernel_size=2, stride=2)
        self.conv = double_conv3d(2 * out_channels, out_channels)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([skip, self.up(x)], dim=1))


class UNet3d(nn.Module):
    """3D U-Net with ``depth`` down/up levels starting at ``width`` channels."""

    def __init__(self, in_channels: int = 1, classes: int = 2, width: int = 8, depth: int = 3) -> None:
        super().__init__()
        channels = [width * 2**level for level in range(depth + 1)]
        self.inc = double_conv3d(in_channels, channels[0])
        self.pool = nn.MaxPool3d(2)
        self.downs = nn.ModuleList(double_conv3d(channels[i], channels[i + 1]) for i in range(depth))
        self.ups = nn.ModuleList(Up3d(channels[i + 1], channels[i]) for i in reversed(range(depth)))
        self.head = nn.Conv3d(channels[0], classes, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.inc(x)]
        for down in self.downs:
            skips.append(down(self.pool(skips[-1])))
        y = skips.pop()
        for up in self.ups:
            y = up(y, skips.pop())
        return self.head(y)


def unet3d() -> UNet3d:
    """The default 3D U-Net: one input channel, two classes, 8–64 channels over three levels."""
    return UNet3d()
