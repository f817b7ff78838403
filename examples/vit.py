"""Vision transformers at the image sizes of large-sample training: torchvision's ``VisionTransformer``.

torchvision's ``vit_b_16`` is built for 224×224 images and refuses others; these factories build the same
architecture for the image a user trains on (ViT-B/16: 12 layers of 12 heads, 768 features, MLP 3072).

``parplan inspect --model examples/vit.py:vit_b_16_64 --input-shape 4,3,64,64``.
"""

from __future__ import annotations

from torchvision.models import VisionTransformer

__all__ = ["vit_b_16_64", "vit_b_16_512", "vit_ti_8_64", "vit_tiny"]


def vit_b_16(image_size: int, num_classes: int = 1000) -> VisionTransformer:
    """ViT-B/16 for square images of ``image_size`` pixels (a multiple of 16)."""
    return VisionTransformer(image_size=image_size, patch_size=16, num_layers=12, num_heads=12, hidden_dim=768,
                             mlp_dim=3072, num_classes=num_classes)


def vit_b_16_64() -> VisionTransformer:
    """ViT-B/16 on 64×64 images (16 patches and the class token)."""
    return vit_b_16(64)


def vit_b_16_512() -> VisionTransformer:
    """ViT-B/16 on 512×512 images (1024 patches and the class token)."""
    return vit_b_16(512)


def vit_ti_8_64() -> VisionTransformer:
    """ViT-Ti/8 (DeiT-Tiny's 12 layers of 3 heads, 192 features, MLP 768) on 64×64 images: 64 patches and the
    class token (``parplan validate``'s transformer on a CPU)."""
    return VisionTransformer(image_size=64, patch_size=8, num_layers=12, num_heads=3, hidden_dim=192, mlp_dim=768,
                             num_classes=1000)


def vit_tiny() -> VisionTransformer:
    """A two-layer ViT of 2 heads and 32 features on 64×64 images in patches of 16 (for quick checks)."""
    return VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                             num_classes=10)
