"""Patterns of real models kept whole under height/width splits until this sitting (model-zoo issue 18, third
sample), each in a tiny model, each split equal to the unsplit model in float64 on two ranks.

* googlenet's auxiliary head: adaptive average pooling of a 2×2 map to 4×4 (each output tile averages its
  windows' rows, received from the tile that holds them), and a tuple of ``(logits, aux)`` outputs, which
  has no height and width to split (it was counted as a runtime gap);
* deeplabv3's pooled branch: a global pool, a 1×1 convolution and a bilinear upsampling of the 1×1 map back
  to the feature map's size — an input with fewer rows than tiles, read whole;
* convmixer's ``Conv2d(padding="same")`` with odd kernels: the explicit padding PyTorch applies;
* hgnetv2's ``F.pad(x, (0, 1, 0, 1))``, timm's ``MaxPool2dSame`` (a ``-inf`` padding computed from the input's
  shape) and MONAI HighResNet's padding of the channels: constant padding splits by height and width;
* MONAI's UNets and SegResNet: group-norm and instance-norm over spatial tiles (statistics per sample and group
  summed over the tiles).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from distributed import run_ranks
from runtime_check import split_step_matches
from torch import nn

from cost_models.capability.predicate import inherent, layer_refusal
from cost_models.layout import Layout

SHAPE = (4, 3, 8, 8)


def same_padding(extent: int, kernel: int, stride: int) -> int:
    """timm's ``get_same_padding`` (a function torch.fx calls without tracing into it, as timm registers it)."""
    return max((math.ceil(extent / stride) - 1) * stride + kernel - extent, 0)


torch.fx.wrap("same_padding")


class AuxHead(nn.Module):
    """googlenet: ``(logits, aux)``, the aux head pooling a 2×2 map to 4×4."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.down = nn.Conv2d(6, 6, 3, stride=2, padding=1)
        self.aux_conv = nn.Conv2d(6, 4, 1)
        self.fc, self.aux_fc = nn.Linear(6, 5), nn.Linear(4 * 16, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        small = torch.relu(self.down(torch.relu(self.stem(x))))  # 2×2
        aux = self.aux_conv(F.adaptive_avg_pool2d(small, (4, 4)))
        logits = self.fc(torch.flatten(F.adaptive_avg_pool2d(small, 1), 1))
        return logits, self.aux_fc(torch.flatten(aux, 1))


class PooledBranch(nn.Module):
    """deeplabv3's ASPP pooling branch beside a 3×3 branch."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.project = nn.Conv2d(6, 6, 1)
        self.head = nn.Conv2d(12, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.conv(x))
        pooled = F.interpolate(torch.relu(self.project(self.pool(features))), size=features.shape[-2:],
                               mode="bilinear", align_corners=False)
        return self.head(torch.cat([features, pooled], dim=1)).mean(dim=(2, 3))


class Paddings(nn.Module):
    """'same' convolutions, an asymmetric zero padding, a -inf 'same' max pool and a padding of the channels."""

    def __init__(self) -> None:
        super().__init__()
        self.same = nn.Conv2d(3, 4, 3, padding="same")
        self.dilated = nn.Conv2d(4, 4, 3, padding="same", dilation=2)
        self.valid = nn.Conv2d(4, 4, 1, padding="valid")
        self.after = nn.Conv2d(6, 5, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.valid(torch.relu(self.dilated(torch.relu(self.same(x)))))
        x = F.pad(x, (0, 1, 0, 1))  # hgnetv2's stem: 9×9
        height, width = x.shape[-2:]
        pad_h, pad_w = same_padding(height, 3, 2), same_padding(width, 3, 2)
        x = F.pad(x, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2], value=-math.inf)
        x = F.max_pool2d(x, 3, 2)  # timm's MaxPool2dSame: 5×5
        x = F.pad(x, (0, 0, 0, 0, 1, 1))  # HighResNet: two more channels
        return self.after(x).mean(dim=(2, 3))


class Norms(nn.Module):
    """MONAI's UNets and SegResNet, diffusion UNets: group-norm and instance-norm (with and without affine)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2, self.conv3 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 6, 3, padding=1), \
            nn.Conv2d(6, 5, 3, stride=2, padding=1)
        self.group = nn.GroupNorm(2, 4)
        self.instance, self.plain = nn.InstanceNorm2d(6, affine=True), nn.InstanceNorm2d(5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.silu(self.group(self.conv1(x)))
        x = torch.relu(self.instance(self.conv2(x)))
        return self.plain(self.conv3(x)).amax(dim=(2, 3))


MODELS = {"aux": AuxHead, "pooled": PooledBranch, "paddings": Paddings, "norms": Norms}


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[name]().to(torch.float64)


def _plan(name: str, world: int, layouts: Sequence[str]) -> tuple[Any, Any]:
    from cost_models.cluster import Cluster, Link
    from cost_models.ir.tracing import trace
    from cost_models.uniform import uniform_plan

    graph = trace(_model(name), SHAPE, torch.float64)
    link = Link(1e-6, 1e9)
    cluster = Cluster(devices=world, devices_per_node=world, memory_bytes=2**34, intra=link, inter=link)
    return uniform_plan(graph, cluster, [Layout.parse(text) for text in [*layouts, "n1"]]), graph


def test_these_layers_take_height_and_width_splits_in_the_capability_predicate() -> None:
    from cost_models.ir.tracing import trace

    graphs = {name: trace(_model(name), SHAPE, torch.float64) for name in MODELS}
    for name, layer in (("aux", "adaptive_avg_pool2d"), ("pooled", "interpolate"), ("paddings", "pad"),
                        ("paddings", "pad_1"), ("paddings", "pad_2"), ("paddings", "same"), ("norms", "group"),
                        ("norms", "instance"), ("norms", "plain")):
        for layout in ("h2", "w2", "h2·w2"):
            assert layer_refusal(graphs[name].nodes[layer], Layout.parse(layout)) is None, (name, layer, layout)
    assert graphs["paddings"].nodes["pad_1"]["attrs"]["pad"] == [1, 1, 1, 1]  # computed from 9×9 when traced
    assert graphs["paddings"].nodes["same"]["attrs"]["padding"] == [1, 1]
    assert graphs["paddings"].nodes["dilated"]["attrs"]["padding"] == [2, 2]
    assert inherent(layer_refusal(graphs["aux"].nodes["fc"], Layout.parse("h2")) or "")  # logits: no height


# --- several ranks ----------------------------------------------------------------------------------------


def _split_equals_unsplit(name: str, world: int, layouts: Sequence[str]) -> dict[str, str]:
    """One step of ``name`` under ``layouts`` (batch-norm synchronised) against the unsplit model, exactly."""
    plan, graph = _plan(name, world, layouts)
    split_step_matches(lambda: _model(name), plan, graph, SHAPE, f"{name} under {layouts}")
    return {layer: str(assignment.layout) for layer, assignment in plan.layers.items()}


def _cases(rank: int, world: int) -> dict[str, Any]:
    return {f"{name} {layout}": _split_equals_unsplit(name, world, [layout])
            for name in MODELS for layout in (["h2", "w2"] if world == 2 else ["h2·w2"])}


@pytest.mark.multirank
def test_the_third_zoo_patterns_equal_the_unsplit_model_on_two_ranks() -> None:
    results = run_ranks(_cases, 2, timeout_s=300)[0]
    for layout in ("h2", "w2"):
        assert results[f"aux {layout}"]["adaptive_avg_pool2d"] == layout
        assert results[f"pooled {layout}"]["interpolate"] == layout
        assert [results[f"paddings {layout}"][name] for name in ("same", "dilated", "pad", "pad_1", "pad_2")] == \
            [layout] * 5
        assert [results[f"norms {layout}"][name] for name in ("group", "instance", "plain")] == [layout] * 3


@pytest.mark.multirank
def test_the_third_zoo_patterns_equal_the_unsplit_model_on_four_tiles_with_corners() -> None:
    results = run_ranks(_cases, 4, timeout_s=300)[0]
    assert results["paddings h2·w2"]["pad_1"] == results["aux h2·w2"]["adaptive_avg_pool2d"] == "h2·w2"
