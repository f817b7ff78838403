"""Tier 1-2: modules torch.fx cannot trace are kept opaque automatically, identically for planner and runtime.

A submodule whose forward torch.fx cannot trace (iterating a tensor, control flow on tensor
values; a branch on a shape traces, ``tests/test_shape_specialize.py``) becomes one opaque layer of
kind ``other``: listed in ``graph.graph["opaque_modules"]`` with the error that
made it so, its forward FLOPs counted, run under a sample split only. The
root's own forward cannot be kept opaque and still fails with a TraceError.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from cost_models.capability.predicate import layer_refusal
from cost_models.cluster import Cluster, Link
from cost_models.errors import PlanError, TraceError
from cost_models.formats.plan import LayerAssignment
from cost_models.ir.flops import layer_flops
from cost_models.ir.tracing import MAX_AUTOMATIC_LEAVES, symbolic_trace, trace
from cost_models.layout import Layout
from cost_models.uniform import uniform_plan
from runtime.preflight import check_runnable

SHAPE = (2, 3, 16, 16)


class Gate(nn.Module):
    """Iterates its input sample by sample: torch.fx cannot trace it (a split changes the count), fake tensors
    (and the runtime) can run it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([sample * 2 for sample in x])


class SameConv(nn.Conv2d):
    """TensorFlow's 'same' padding, computed from the input's size (timm's Conv2dSame): not a plain nn.Conv2d."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ih, iw = x.shape[-2:]
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        pad_h = max((math.ceil(ih / sh) - 1) * sh + kh - ih, 0)
        pad_w = max((math.ceil(iw / sw) - 1) * sw + kw - iw, 0)
        if pad_h > 0 or pad_w > 0:
            x = F.pad(x, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2])
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


class PerSampleConv(nn.Conv2d):
    """A convolution applied sample by sample (iterating the tensor): kept opaque."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([F.conv2d(s[None], self.weight, self.bias, self.stride, self.padding) for s in x])


class InheritedConv(nn.Conv2d):
    """A subclass that keeps nn.Conv2d's forward: the same layer."""


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.body = nn.Sequential(nn.ReLU(), Gate())
        self.same = PerSampleConv(8, 8, 4, stride=2, padding=1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.same(self.body(self.stem(x))))


def test_untraceable_modules_are_kept_opaque_and_listed() -> None:
    graph = trace(Net(), SHAPE)
    opaque = graph.graph["opaque_modules"]
    assert [(entry["module"], entry["class"]) for entry in opaque] == [("body.1", "Gate"), ("same", "PerSampleConv")]
    assert all("control flow" in entry["reason"] for entry in opaque)
    for name, shape in (("body_1", [2, 8, 16, 16]), ("same", [2, 8, 8, 8])):
        layer = graph.nodes[name]
        assert layer["kind"] == "other" and layer["attrs"]["opaque"] == "automatic"
        assert layer["output_shape"] == shape
    assert graph.nodes["stem"]["kind"] == graph.nodes["head"]["kind"] == "conv"
    assert graph.totals()["params"] == sum(p.numel() for p in Net().parameters())
    assert trace(Net(), SHAPE).fingerprint == graph.fingerprint  # deterministic: planner and runtime agree


def test_opaque_layers_run_under_a_sample_split_only() -> None:
    graph = trace(Net(), SHAPE)
    for name in ("body_1", "same"):
        layer = graph.nodes[name]
        assert layer_refusal(layer, Layout(n=2)) is None
        assert "cannot be split by height or width" in layer_refusal(layer, Layout(h=2))
        assert "cannot be split by channel" in layer_refusal(layer, Layout(c=2))
    assert layer_refusal(graph.nodes["stem"], Layout(h=2)) is None  # the traced convolutions still split


def test_the_runtime_traces_the_same_layers_and_refuses_spatial_splits_of_opaque_ones() -> None:
    model, graph = Net(), trace(Net(), SHAPE)
    nodes = [node.name for node in symbolic_trace(model, ()).graph.nodes if node.name in graph]
    assert nodes == list(graph.nodes)
    cluster = Cluster(devices=2, devices_per_node=2, memory_bytes=2**34, intra=Link(1e-6, 1e9),
                      inter=Link(1e-6, 1e9))
    check_runnable(model, uniform_plan(graph, cluster, [Layout(n=2)]), graph, verify=True)
    whole = uniform_plan(graph, cluster, [Layout()])
    for layout in (Layout(h=2), Layout(c=2)):
        forced = replace(whole, layers={**whole.layers, "body_1": LayerAssignment(layout),
                                        "same": LayerAssignment(layout)})
        with pytest.raises(PlanError, match=rf"'body_1' \(other, {layout}\).*'same' \(other, {layout}\)"):
            check_runnable(model, forced, graph)


def test_the_traced_program_computes_the_model() -> None:
    torch.manual_seed(0)
    model = Net().double()
    x = torch.randn(SHAPE, dtype=torch.float64)
    torch.testing.assert_close(symbolic_trace(model, ())(x), model(x), rtol=0, atol=0)


def test_opaque_forward_flops_are_counted() -> None:
    model, graph = Net(), trace(Net(), SHAPE)
    with FlopCounterMode(display=False) as counter:
        model.same(torch.randn(2, 8, 16, 16))
    layer = graph.nodes["same"]
    assert layer["flops_fwd"] == counter.get_total_flops() == 2 * 2 * 8 * 8 * 8 * 8 * 16
    assert layer["flops_bwd_data"] == layer["flops_bwd_weight"] == layer["flops_fwd"]
    assert graph.nodes["body_1"]["flops_fwd"] == 0  # no matrix products inside: counted per element (none)


def test_a_conv_subclass_with_its_own_forward_is_not_a_conv_even_as_a_leaf() -> None:
    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.same = SameConv(3, 4, 3)
            self.plain = InheritedConv(4, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.plain(self.same(x))

    graph = trace(Pair(), SHAPE, leaf_modules=["SameConv", "InheritedConv"])
    assert graph.graph["opaque_modules"] == []  # the user's leaves, not automatic ones
    assert graph.nodes["same"]["kind"] == "other" and "opaque" not in graph.nodes["same"]["attrs"]
    assert graph.nodes["plain"]["kind"] == "conv" and graph.nodes["plain"]["attrs"]["padding"] == [1, 1]


class RootBranches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.mean() > 0:  # on values
            x = x[:, :, :8]
        return self.conv(x)


def test_the_root_forward_cannot_be_kept_opaque() -> None:
    with pytest.raises(TraceError, match=r"cannot trace the forward of RootBranches.*cannot be kept opaque"):
        trace(RootBranches(), SHAPE)


def test_the_number_of_automatic_leaves_is_bounded() -> None:
    model = nn.Sequential(*[Gate() for _ in range(MAX_AUTOMATIC_LEAVES + 1)])
    with pytest.raises(TraceError, match=rf"module '{MAX_AUTOMATIC_LEAVES}' \(Gate\).*{MAX_AUTOMATIC_LEAVES} modules"):
        trace(model, SHAPE)
    graph = trace(nn.Sequential(*[Gate() for _ in range(3)]), SHAPE)
    assert [entry["module"] for entry in graph.graph["opaque_modules"]] == ["0", "1", "2"]


class OptionalArguments(nn.Module):
    """``model(x)`` takes the defaults: ``mask`` is None, ``features`` False (timm's Hiera, MONAI's
    ``torch.as_tensor`` of its output)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, features: bool = False) -> torch.Tensor:
        if mask is not None:
            x = x * mask.view(len(mask), 1, 1, 1)
        y = self.conv(x)
        return y if features else torch.as_tensor(y.relu())


def test_optional_arguments_take_their_defaults() -> None:
    model = OptionalArguments().double()
    traced = symbolic_trace(model, ())
    assert [node.name for node in traced.graph.nodes if node.op == "placeholder"] == ["x"]
    x = torch.randn(SHAPE, dtype=torch.float64)
    torch.testing.assert_close(traced(x), model(x), rtol=0, atol=0)
    graph = trace(OptionalArguments(), SHAPE)
    assert graph.graph["opaque_modules"] == [] and [graph.nodes[n]["kind"] for n in graph] == [
        "input", "conv", "activation", "identity"]


@pytest.mark.parametrize(("kind", "inputs", "attrs", "expected"), [
    ("conv", [], {"weight_shape": [4, 3, 3, 3]}, 2 * 2 * 6 * 6 * 4 * 3 * 9),  # of a parameter: no tensor input
    ("conv", [[2, 3, 8, 8], [4, 3, 3, 3]], {}, 2 * 2 * 6 * 6 * 4 * 3 * 9),  # F.conv2d(x, computed weight)
    ("conv", [[[2, 3, 8, 8], [2, 3, 8, 8]]], {"weight_shape": [4, 3, 3, 3]}, 2 * 2 * 6 * 6 * 4 * 3 * 9),
    ("conv", [[2, 3, 8, 8]], {}, 0),  # no weight shape known anywhere: per element
    ("linear", [], {"weight_shape": [5, 7]}, 2 * (2 * 4 * 6) * 7 * 5),  # a linear map of a parameter
    ("maxpool", [[2, 4, 12, 12]], {"kernel_size": None}, 2 * 4 * 6 * 6),
    ("adaptive_avgpool", [[[2, 4, 6, 6]]], {}, 2 * 4 * 6 * 6),  # a tuple-valued input is not a shape
])
def test_flops_of_unusual_arity(kind: str, inputs: list, attrs: dict, expected: int) -> None:
    output = [2, 4, 6, 6] if kind != "linear" else [2, 4, 6, 5]
    flops = layer_flops(kind, inputs, output, attrs, needs_input_grad=True, has_weight=True)
    assert flops.fwd == expected


def test_counted_flops_scale_with_the_local_output() -> None:
    attrs = {"flops_per_output": 12.5}
    whole = layer_flops("other", [[4, 3, 8, 8]], [4, 2, 8, 8], attrs, needs_input_grad=False, has_weight=True)
    half = layer_flops("other", [[2, 3, 8, 8]], [2, 2, 8, 8], attrs, needs_input_grad=False, has_weight=True)
    assert (whole.fwd, whole.bwd_data, whole.bwd_weight) == (6400, 0, 6400)
    assert half.fwd * 2 == whole.fwd


class _NormBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class _HoldsNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _NormBlock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x).relu()


def test_an_opaque_module_holding_batchnorm_takes_no_sample_split_when_statistics_are_synchronised() -> None:
    graph = trace(_HoldsNorm(), (4, 3, 8, 8), leaf_modules=["block"])
    layer = graph.nodes["block"]
    assert layer["kind"] == "other" and layer["attrs"]["batch_norms"] == 1
    assert layer_refusal(layer, Layout(n=2)) is None  # each part's own statistics, as DDP trains
    assert "cannot synchronise" in layer_refusal(layer, Layout(n=2), sync_batchnorm=True)
    assert layer_refusal(layer, Layout(), sync_batchnorm=True) is None


class _JitGuarded(nn.Module):
    """MONAI's UpCat pattern: a skip connection concatenated under ``torch.jit.isinstance(skip, torch.Tensor)``."""

    def __init__(self) -> None:
        super().__init__()
        self.down, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.down(x)
        if torch.jit.isinstance(skip, torch.Tensor):
            skip = torch.cat([skip, skip.relu()], dim=1)
        return self.head(skip)


def test_torch_jit_isinstance_of_a_traced_tensor_takes_the_branch_a_real_input_takes() -> None:
    model = _JitGuarded().double()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    graph = trace(model, (2, 3, 8, 8))
    assert any(graph.nodes[name]["kind"] == "cat" for name in graph.compute_layers())
    assert torch.equal(symbolic_trace(model, ())(x), model(x))
    assert torch.jit.isinstance(x, torch.Tensor) and not torch.jit.isinstance(3, torch.Tensor)  # restored
