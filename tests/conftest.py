"""Shared fixtures: the models the tiers use, and the repository on sys.path (for examples/)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SMALL_SHAPE = (2, 3, 64, 64)
TORCHVISION_MODELS = ("resnet18", "resnet50", "vgg11", "densenet121", "mobilenet_v2")
ALL_MODELS = TORCHVISION_MODELS + ("unet",)


def build_model(name: str):  # noqa: ANN201 - returns an nn.Module; torch is imported lazily
    """A test model by name: a torchvision model (random weights) or the example UNet."""
    import torch

    torch.manual_seed(0)
    from small_models import MODELS

    if name in MODELS:
        return MODELS[name]()
    if name == "unet":
        from examples.unet import unet

        return unet()
    import torchvision

    return torchvision.models.get_model(name, weights=None)


@pytest.fixture(scope="session")
def repo() -> Path:
    """The repository root."""
    return REPO
