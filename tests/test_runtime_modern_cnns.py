"""Modern CNN blocks split by height and width (issue 19), each equal to the unsplit model in float64:

* a diffusion-style UNet: GroupNorm + SiLU residual blocks with ``Dropout2d`` (keyed masks), a strided
  convolution down, nearest upsampling, a skip concatenation and a second input — the timestep embedding —
  added per channel (a ``(N, C, 1, 1)`` value broadcast onto every tile);
* a ``PixelShuffle`` upsampler and a ``PixelUnshuffle`` (module and function): each ``r×r`` block of positions
  moves to ``r²`` channels inside a tile when the parts align;
* ShuffleNetV2's channel shuffle (a 5-D view ``(N, groups, C/groups, H, W)``, a transpose and a view back): its
  values keep their rows and columns in named dimensions (``cost_models.ir.orders``), so the views run on the boxes;
* EfficientNet's squeeze-excitation gates (``x * sigmoid(fc(pool(x)))``: a pooled vector times a tiled map),
  in a narrow EfficientNet-B0 with stochastic depth active.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from distributed import run_ranks
from runtime_check import step_cases
from torch import nn

from cost_models.capability.predicate import layer_refusal
from cost_models.layout import Layout
from cost_models.local_problem import local_problem

SEED = 5
SHAPES = {"diffusion": ((4, 3, 16, 16), (4, 8)), "shuffle": ((4, 3, 8, 8),), "efficientnet": ((4, 3, 32, 32),),
          "groups": ((4, 3, 8, 8),), "shufflenet": ((4, 3, 64, 64),), "std": ((4, 3, 12, 12),),
          "tf_same": ((4, 3, 13, 15),), "selective": ((4, 3, 8, 8),)}


class ResBlock(nn.Module):
    """GroupNorm → SiLU → conv, plus the timestep embedding per channel, GroupNorm → SiLU → Dropout2d → conv."""

    def __init__(self, channels: int, embedding: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.GroupNorm(2, channels), nn.GroupNorm(2, channels)
        self.conv1, self.conv2 = nn.Conv2d(channels, channels, 3, padding=1), nn.Conv2d(channels, channels, 3, padding=1)
        self.emb = nn.Linear(embedding, channels)
        self.drop = nn.Dropout2d(0.3)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.emb(F.silu(emb))[:, :, None, None]
        return x + self.conv2(self.drop(F.silu(self.norm2(h))))


class DiffusionUNet(nn.Module):
    """Two levels: down by a strided convolution, up by nearest upsampling, the skip concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.time = nn.Sequential(nn.Linear(8, 8), nn.SiLU(), nn.Linear(8, 8))
        self.block1, self.block2, self.block3 = ResBlock(8, 8), ResBlock(16, 8), ResBlock(8, 8)
        self.down = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.reduce = nn.Conv2d(24, 8, 1)
        self.out = nn.Conv2d(8, 5, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        emb = self.time(t)
        skip = self.block1(self.stem(x), emb)
        low = self.block2(self.down(skip), emb)
        up = F.interpolate(low, scale_factor=2, mode="nearest")
        return self.out(self.block3(self.reduce(torch.cat([skip, up], dim=1)), emb)).mean(dim=(2, 3))


class Shuffles(nn.Module):
    """A super-resolution head (conv → PixelShuffle) and a space-to-depth stem (PixelUnshuffle), both forms."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.shuffle, self.unshuffle = nn.PixelShuffle(2), nn.PixelUnshuffle(2)
        self.mid = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Conv2d(16, 5, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.mid(self.shuffle(self.conv(x))))  # 16×16
        x = F.pixel_unshuffle(F.pixel_shuffle(self.unshuffle(x), 2), 2)  # 8×8, 16 channels
        return self.head(x).mean(dim=(2, 3))


class GroupNorms(nn.Module):
    """Group-norms whose groups straddle a channel split's parts (3 groups of 2 channels on 2 or 4 parts), as modules
    and as ``F.group_norm``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 6, 3, padding=1)
        self.norm1, self.norm2 = nn.GroupNorm(3, 6), nn.InstanceNorm2d(6, affine=True)
        self.norm3, self.head = nn.GroupNorm(2, 6, affine=False), nn.Conv2d(6, 5, 1)
        self.scale, self.shift = nn.Parameter(torch.linspace(0.5, 1.5, 6)), nn.Parameter(torch.linspace(-1, 1, 6))
        self.gain = nn.Parameter(torch.tensor(0.8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv2(F.silu(self.norm1(self.conv1(x))))
        x = F.group_norm(x, 3, self.scale, self.shift, 1e-5)  # timm's GroupNorm1 calls the function
        x = self.gain * torch.relu(x) ** 2 + torch.exp(-x.sub(0.5).div(2).clamp(min=-1.0).square()) + \
            (x.abs() + 1).rsqrt()  # StarReLU (poolformerv2) and point-wise maths: element-wise under any split
        return self.head(self.norm3(torch.relu(self.norm2(x)))).mean(dim=(2, 3))


class StandardisedConvs(nn.Module):
    """Convolutions as function calls with filters computed from parameters: timm's ``StdConv2d`` and
    ``ScaledStdConv2d`` (weight standardisation, NFNets and BiT), ``F.conv2d`` of a parameter with ``'same'``
    padding of an even kernel; and a dynamic convolution whose filters come from the batch (split by sample only)."""

    def __init__(self) -> None:
        super().__init__()
        from timm.layers import ScaledStdConv2d, StdConv2d

        self.std, self.scaled = StdConv2d(3, 6, 3, padding=1), ScaledStdConv2d(6, 6, 3, stride=2, padding=1)
        self.even = nn.Parameter(torch.randn(6, 6, 2, 2) * 0.3)
        self.route = nn.Linear(6, 6 * 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.silu(self.scaled(F.silu(self.std(x))))
        x = F.conv2d(x, self.even, None, 1, "same")
        filters = self.route(x.mean(dim=(2, 3))).mean(dim=0).reshape(6, 6, 1, 1)  # from the batch
        return F.conv2d(x, filters).mean(dim=(2, 3))


class TensorFlowSame(nn.Module):
    """timm's ``Conv2dSame`` (TensorFlow's 'SAME': ``tf_efficientnet_*``, NASNet): padding computed from the input's
    extent, one row more after than before on an odd extent under a stride of 2."""

    def __init__(self) -> None:
        super().__init__()
        from timm.layers import Conv2dSame
        from timm.layers.pool2d_same import AvgPool2dSame, MaxPool2dSame

        self.down = Conv2dSame(3, 6, 3, stride=2)
        self.wide = Conv2dSame(6, 6, 5)
        self.depthwise = Conv2dSame(6, 6, 4, stride=2, groups=6)
        self.peak, self.average = MaxPool2dSame(3, stride=1), AvgPool2dSame(3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.peak(self.wide(F.silu(self.down(x))) - 1.0)  # negative maxima: a pad of zeros would win
        return self.average(self.depthwise(F.silu(x))).mean(dim=(2, 3))


class SelectiveKernels(nn.Module):
    """Selective kernels (skresnet) and split attention (resnest): branches stacked along a new dimension 1 or a
    reshape to ``(N, radix, C, H, W)``, attention over the radix from a pooled sum, the branches weighed and
    summed over dimension 1."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.small, self.large = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=2, dilation=2)
        self.select, self.split, self.head = nn.Conv2d(4, 8, 1), nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(4, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        paths = torch.stack([self.small(x), self.large(x)], dim=1)  # (N, 2, C, H, W)
        attention = self.select(paths.sum(dim=1).mean((2, 3), keepdim=True)).view(x.shape[0], 2, 4, 1, 1)
        x = (paths * attention.softmax(dim=1)).sum(dim=1)
        radix = self.split(x).reshape(x.shape[0], 2, 4, x.shape[2], x.shape[3])  # resnest's
        return self.head(radix.sum(dim=1) + radix.amax(dim=1, keepdim=True)[:, 0]).mean(dim=(2, 3))


def _efficientnet() -> nn.Module:
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf

    settings, last = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.25)
    return EfficientNet(settings, 0.2, stochastic_depth_prob=0.5, num_classes=5, last_channel=last)


def _shufflenet() -> nn.Module:
    from torchvision.models.shufflenetv2 import ShuffleNetV2

    return ShuffleNetV2([1, 1, 1], [8, 16, 32, 64, 128], num_classes=5)


MODELS = {"diffusion": DiffusionUNet, "shuffle": Shuffles, "efficientnet": _efficientnet, "groups": GroupNorms,
          "shufflenet": _shufflenet, "std": StandardisedConvs, "tf_same": TensorFlowSame,
          "selective": SelectiveKernels}


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[name]().to(torch.float64).train()


def _graph(name: str) -> Any:
    from cost_models.ir.tracing import trace

    return trace(_model(name), SHAPES[name], torch.float64)


def test_pixel_shuffles_split_when_their_parts_align() -> None:
    graph = _graph("shuffle")
    for name in ("shuffle", "unshuffle", "pixel_shuffle", "pixel_unshuffle"):
        assert graph.nodes[name]["kind"] == "pixel_shuffle" and graph.nodes[name]["attrs"]["factor"] == 2
        for layout in ("h2", "w2", "h2·w2", "c2", "h4"):
            assert layer_refusal(graph.nodes[name], Layout.parse(layout)) is None, (name, layout)
    odd = {**graph.nodes["shuffle"], "input_shapes": [[4, 16, 5, 8]], "output_shape": [4, 4, 10, 16]}
    assert "does not align" in layer_refusal(odd, Layout.parse("h2"))  # rows 0–3 of 5 are not rows 0–6 of 10


def test_gates_group_norms_and_channel_shuffles_take_every_spatial_split() -> None:
    for name in ("diffusion", "efficientnet", "shufflenet"):
        graph = _graph(name)
        for layout in ("h2", "h2·w2"):
            refused = [n for n in graph.nodes if len(graph.nodes[n]["output_shape"]) == 4
                       and graph.nodes[n]["output_shape"][2] > 1 and layer_refusal(graph.nodes[n], Layout.parse(layout))]
            assert not refused, (name, layout, refused)


# --- several ranks ----------------------------------------------------------------------------------------


def _shapes(name: str) -> Any:
    return SHAPES[name] if len(SHAPES[name]) > 1 else SHAPES[name][0]


def _cases(rank: int, world: int, cases: Sequence[tuple[str, str]]) -> dict[str, dict[str, str]]:
    return step_cases(cases, world, _model, _shapes, seed=SEED)


def test_stacks_and_reductions_over_unsplit_dimensions_keep_every_split() -> None:
    graph = _graph("selective")
    names = ("stack", "sum_1", "mul", "sum_2", "sum_3", "amax")
    orders = [graph.nodes[name]["attrs"].get("order") for name in names]
    assert orders == ["n.chw", "nchw", "n.chw", "nchw", "nchw", "n..hw"]
    for layout in ("h2", "w2", "h2·w2", "n2·h2", "c2"):
        refused = {name: why for name in names if (why := layer_refusal(graph.nodes[name], Layout.parse(layout)))}
        assert not refused if layout != "c2" else set(refused) == {"sum_3", "amax"}, (layout, refused)
    assert "reduces dimensions holding the h axis" in layer_refusal(
        {**graph.nodes["sum_1"], "attrs": {**graph.nodes["sum_1"]["attrs"], "reduces": [3]}}, Layout.parse("h2"))


def test_tensorflow_same_convolutions_are_convolutions_with_the_traced_pads() -> None:
    graph = _graph("tf_same")
    assert [graph.nodes[name]["attrs"]["pads"] for name in ("down", "wide", "depthwise")] == \
        [[[1, 1], [1, 1]], [[2, 2], [2, 2]], [[1, 2], [1, 1]]]
    assert all(graph.nodes[name]["kind"] == "conv" for name in ("down", "wide", "depthwise"))
    assert [(graph.nodes[name]["kind"], graph.nodes[name]["attrs"]["pads"]) for name in ("peak", "average")] == \
        [("maxpool", [[1, 1], [1, 1]]), ("avgpool", [[0, 1], [0, 1]])]


def test_convolution_calls_with_filters_from_parameters_split_by_space_and_from_the_batch_by_sample() -> None:
    graph = _graph("std")
    calls = [name for name in graph.compute_layers() if graph.nodes[name]["kind"] == "conv"]
    assert len(calls) == 4 and all(graph.nodes[name]["attrs"]["function_form"] for name in calls)
    for layout in ("h2", "w2", "h2·w2"):
        refusals = [layer_refusal(graph.nodes[name], Layout.parse(layout)) for name in calls]
        assert refusals[:3] == [None] * 3 and "function call" in refusals[3], (layout, refusals)
    assert graph.nodes[calls[3]]["attrs"]["weight_from_batch"] is True
    assert all("function call" in layer_refusal(graph.nodes[name], Layout.parse("c2")) for name in calls)
    problem = local_problem(graph.nodes[calls[2]], Layout.parse("h2"), 8, "float64")
    assert problem is not None and problem.output_shape == (4, 6, 3, 6)


@pytest.mark.multirank
def test_modern_blocks_equal_the_unsplit_model_on_two_ranks() -> None:
    cases = [(name, layout) for name in MODELS for layout in ("h2", "w2")] + [("shuffle", "c2"), ("diffusion", "n2"),
                                                                             ("groups", "c2"), ("tf_same", "c2")]
    results = run_ranks(_cases, 2, args=(cases,), timeout_s=300)[0]
    assert [results["groups c2"][name] for name in ("norm1", "group_norm", "norm2", "norm3")] == ["c2"] * 4
    assert [results["shufflenet w2"][name] for name in ("view", "transpose", "contiguous", "view_1")] == ["w2"] * 4
    for layout in ("h2", "w2", "c2"):
        assert results[f"shuffle {layout}"]["shuffle"] == layout
    assert results["diffusion h2"]["block1_norm1"] == "h2" and results["diffusion w2"]["block2_drop"] == "w2"
    assert all(results[f"selective {layout}"][name] == layout for layout in ("h2", "w2")
               for name in ("stack", "sum_1", "mul", "sum_2", "sum_3", "amax"))
    assert all(results[f"tf_same {layout}"][name] == layout for layout in ("h2", "w2", "c2")
               for name in ("down", "wide", "depthwise", "peak", "average"))
    assert [results["std h2"][name] for name in ("conv2d", "conv2d_1", "conv2d_2", "conv2d_3")] == \
        ["h2", "h2", "h2", "n1"]


@pytest.mark.multirank
def test_modern_blocks_equal_the_unsplit_model_on_four_ranks() -> None:
    cases = [("diffusion", "h2·w2"), ("efficientnet", "h2·w2"), ("diffusion", "n2·h2"), ("groups", "c2·h2"),
             ("groups", "c4"), ("shufflenet", "h2·w2")]
    results = run_ranks(_cases, 4, args=(cases,), timeout_s=300)[0]
    assert results["groups c2·h2"]["norm1"] == "c2·h2" and results["groups c4"]["norm3"] == "c4"
    assert [results["groups c2·h2"][name] for name in ("pow_1", "clamp", "rsqrt")] == ["c2·h2"] * 3
    assert results["diffusion h2·w2"]["block2_norm2"] == "h2·w2"


def test_calibration_times_the_new_forms_on_their_local_problems() -> None:
    """Calibration builds a kernel for each new form's local problem (norms, padding modes, pixel shuffles, an
    even kernel's 'same'), whose forward makes the local output the cost model prices."""
    from test_runtime_borders import Periodic

    from calibrate.kernels import TIMED_KINDS, build_kernel
    from cost_models.local_problem import local_problem

    kinds = set()
    for model, shapes in ((Periodic(), (4, 3, 8, 8)), (DiffusionUNet(), SHAPES["diffusion"]), (Shuffles(), (4, 3, 8, 8))):
        from cost_models.ir.tracing import trace

        graph = trace(model, shapes)
        for name in graph.nodes:
            for layout in ("n1", "h2", "w2"):
                problem = local_problem(graph.nodes[name], Layout.parse(layout), 4, "float32")
                if problem is None or problem.kind not in TIMED_KINDS or problem.kind in ("linear", "cat"):
                    continue
                out = build_kernel(problem, "fwd", torch.device("cpu"))()
                assert tuple(out.shape) == problem.output_shape, (name, layout, tuple(out.shape), problem.output_shape)
                kinds.add(problem.kind)
    assert {"norm", "pad", "pixel_shuffle", "conv"} <= kinds


@pytest.mark.parametrize("name", ["edgenext_xx_small", "efficientvim_m1"])
def test_every_layer_of_a_mixed_model_has_a_local_problem_or_a_refusal_under_every_layout(name: str) -> None:
    """Ordered values with dimensions holding no axis (``.``) and 1-D convolutions' per-axis lists: the cost
    model's local problems and the predicate answer for every layer (the zoo run hit internal errors here)."""
    import timm

    from cost_models.ir.tracing import trace
    from cost_models.local_problem import local_problem

    graph = trace(timm.create_model(name, pretrained=False), (4, 3, 32, 32))  # the zoo run's side
    for layout in ("n2", "c2", "h2", "w2", "h2·w2", "n2·h2"):
        for layer in graph.nodes:
            local_problem(graph.nodes[layer], Layout.parse(layout), 4, "float32")
