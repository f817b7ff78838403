"""Small models that exercise what real model zoos do: functional layers, batch-norm after a global pool."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FunctionalNet(nn.Module):
    """Pooling, padding, interpolation and a convolution called as functions, with their defaults."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.weight = nn.Parameter(torch.randn(8, 8, 3, 3) * 0.1)
        self.head = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = F.relu(self.stem(x))
        z = F.avg_pool2d(z, 2)                                   # no stride: the kernel's
        z = F.max_pool2d(z, kernel_size=3, stride=1, padding=1)  # keywords
        z = F.conv2d(F.pad(z, (1, 1, 1, 1)), self.weight)       # a functional convolution on explicit padding
        z = F.interpolate(z, size=(x.shape[2], x.shape[3]), mode="nearest")  # size= from a shape read
        return self.head(z).mean((2, 3))


class NormAfterPool(nn.Module):
    """Batch-norm after a global pool and a 1×1 map: one value per channel per sample (Inception's, SE blocks')."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.squeeze = nn.Conv2d(8, 8, 1)
        self.norm = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.relu(self.norm(self.squeeze(self.pool(self.conv(x))))), 1))


MODELS = {"functional": FunctionalNet, "norm_after_pool": NormAfterPool}


def timm_vit_tiny() -> nn.Module:
    """timm's ViT (its attention: one ``qkv`` projection, ``unbind``, ``F.scaled_dot_product_attention``), two
    blocks on 64×64 images."""
    import timm

    return timm.create_model("vit_tiny_patch16_224", img_size=64, num_classes=10, depth=2)


def swin_tiny() -> nn.Module:
    """torchvision's Swin Transformer at two stages of 2 blocks (24 and 48 features, windows of 4, shifted by 2 in
    every second block) for 64×64 images: 16×16 then 8×8 patches (whole windows on 2 and 4 tiles)."""
    from torchvision.models.swin_transformer import SwinTransformer

    return SwinTransformer(patch_size=[4, 4], embed_dim=24, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4],
                           stochastic_depth_prob=0.0, num_classes=10)


class Spectral(nn.Module):
    """A Fourier layer as neural operators write it: ``rfft2``, a complex weight on the lowest modes, ``irfft2``
    (complex parameters and activations)."""

    def __init__(self, channels: int = 4, modes: int = 3) -> None:
        super().__init__()
        self.lift = nn.Conv2d(3, channels, 1)
        self.weight = nn.Parameter(torch.randn(channels, channels, modes, modes, dtype=torch.cfloat) / channels)
        self.modes = modes
        self.head = nn.Conv2d(channels, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lift(x)
        spectrum = torch.fft.rfft2(y)
        mixed = torch.einsum("bixy,ioxy->boxy", spectrum[:, :, :self.modes, :self.modes], self.weight)
        out = torch.zeros_like(spectrum)
        out[:, :, :self.modes, :self.modes] = mixed
        z = torch.fft.irfft2(out, s=y.shape[-2:])
        return self.head(torch.relu(z + y)).mean((2, 3))


def spectral() -> nn.Module:
    return Spectral()


def monai_unet3d() -> nn.Module:
    """MONAI's 3-D UNet (residual units), small: 1 channel in, 2 classes out."""
    from monai.networks.nets import UNet

    return UNet(3, 1, 2, channels=(4, 8, 16), strides=(2, 2), num_res_units=1)
