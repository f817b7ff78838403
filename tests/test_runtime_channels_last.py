"""Channels-last blocks split by height and width (issue 19, item 2): ConvNeXt's ``permute`` → LayerNorm → Linear →
GELU → Linear → layer scale → ``permute`` back, with stochastic depth active, equal to the unsplit model in float64.

The tracer records each 4-D value's order (``cost_models.ir.orders``): ``x.permute(0, 2, 3, 1)`` of a value split by
rows holds its rows in dimension 1, a permuted box and no redistribution. A LayerNorm over the channels and a
linear layer on a channels-last value compute per position: they take any split that keeps the channels whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from distributed import run_ranks
from runtime_check import step_cases
from torch import nn

from cost_models.capability.predicate import layer_refusal
from cost_models.ir.orders import logical, permutation
from cost_models.layout import Layout
from runtime.placement import Placement

SHAPE = (4, 3, 16, 16)
SEED = 7


class ChannelsLast(nn.Module):
    """Permutations written every way, a LayerNorm module and ``F.layer_norm``, a layer scale on channels-last."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.norm = nn.LayerNorm(6)
        self.up, self.down = nn.Linear(6, 12), nn.Linear(12, 6)
        self.gamma = nn.Parameter(torch.linspace(0.5, 1.5, 6))
        self.head = nn.Conv2d(6, 5, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        y = self.down(nn.functional.gelu(self.up(self.norm(x.permute(0, 2, 3, 1)))))
        y = (self.gamma * y).transpose(1, 3).transpose(2, 3)  # nhwc → nwhc... → nchw
        x = x + y
        z = torch.movedim(x, 1, -1)
        z = nn.functional.layer_norm(z, (6,), self.norm.weight, None, 1e-6)
        return self.head(torch.permute(z, (0, 3, 1, 2))).mean(dim=(2, 3))


class GatedChannelsLast(nn.Module):
    """MambaOut's gated block: a channels-last value cut into pieces along its channels (``split(…, dim=-1)``), a
    piece permuted back for a depthwise convolution and forth again, concatenated with another, gated by the
    third."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.norm, self.up, self.down = nn.LayerNorm(6), nn.Linear(6, 12), nn.Linear(6, 6)
        self.mix = nn.Conv2d(4, 4, 3, padding=1, groups=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        gate, identity, mixed = torch.split(self.up(self.norm(x.permute(0, 2, 3, 1))), [6, 2, 4], dim=-1)
        mixed = self.mix(mixed.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        y = self.down(nn.functional.silu(gate) * torch.cat((identity, mixed), dim=-1))
        return (x + y.permute(0, 3, 1, 2)).mean(dim=(2, 3))


def _tiny_convnext() -> nn.Module:
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    return ConvNeXt([CNBlockConfig(8, 16, 2), CNBlockConfig(16, None, 1)], stochastic_depth_prob=0.5, num_classes=5)


MODELS = {"channels_last": ChannelsLast, "convnext": _tiny_convnext, "gated": GatedChannelsLast}


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[name]().to(torch.float64).train()


def _graph(name: str) -> Any:
    from cost_models.ir.tracing import trace

    return trace(_model(name), SHAPE, torch.float64)


def test_permutations_carry_the_order_of_a_values_axes() -> None:
    graph = _graph("channels_last")
    orders = {name: graph.nodes[name]["attrs"].get("order", "nchw") for name in graph.nodes}
    assert [orders[name] for name in ("permute", "norm", "up", "down", "mul", "transpose", "transpose_1",
                                      "movedim", "layer_norm", "permute_1")] == \
        ["nhwc", "nhwc", "nhwc", "nhwc", "nhwc", "ncwh", "nchw", "nhwc", "nhwc", "nchw"]
    assert logical([4, 16, 16, 6], "nhwc") == [4, 6, 16, 16]
    box = Placement(Layout.parse("h2"), order="nhwc").box((4, 16, 16, 6), 1)
    assert box == ((0, 4), (8, 16), (0, 16), (0, 6))


def test_pieces_of_a_channels_last_value_and_their_concatenation_keep_its_order() -> None:
    graph = _graph("gated")
    attrs = {name: graph.nodes[name]["attrs"] for name in graph.nodes}
    assert attrs["split"]["piece_order"] == "nhwc"
    assert [attrs[name].get("order") for name in ("getitem", "getitem_1", "getitem_2", "cat", "mul")] == ["nhwc"] * 5
    for layout in ("h2", "w2", "h2·w2"):
        refused = {name: why for name in graph.compute_layers() if graph.nodes[name]["kind"] != "mean"
                   and (why := layer_refusal(graph.nodes[name], Layout.parse(layout)))}
        assert not refused, (layout, refused)
    assert "cuts dimension 3 into pieces" in layer_refusal(graph.nodes["split"], Layout.parse("c2"))


def test_permutation_reads_every_way_of_writing_one() -> None:
    graph = torch.fx.symbolic_trace(ChannelsLast()).graph
    calls = {node.name: permutation(node, 4) for node in graph.nodes if node.op in ("call_method", "call_function")}
    assert calls["permute"] == [0, 2, 3, 1] and calls["transpose"] == [0, 3, 2, 1]
    assert calls["movedim"] == [0, 2, 3, 1] and calls["permute_1"] == [0, 3, 1, 2]


def test_channels_last_blocks_take_height_and_width_splits_and_linear_layers_channel_splits() -> None:
    graph = _graph("convnext")
    shapes = {name: (graph.nodes[name]["output_shape"], graph.nodes[name]["attrs"].get("order", "nchw"))
              for name in graph.nodes}
    head = {name for name, (shape, order) in shapes.items() if len(shape) != 4 or logical(shape, order)[2:] == [1, 1]}
    assert len(head) < 10 and graph.nodes["features_1_0_block_2"]["attrs"]["order"] == "nhwc"
    for layout in ("h2", "w2", "h2·w2", "n2·h2"):
        refused = {name for name in graph.nodes if layer_refusal(graph.nodes[name], Layout.parse(layout))}
        assert not refused - head, (layout, sorted(refused - head))
    linear = next(name for name in graph.nodes if graph.nodes[name]["kind"] == "linear")
    assert layer_refusal(graph.nodes[linear], Layout.parse("c2")) is None  # its filters split
    norm = graph.nodes[linear.replace("block_3", "block_2")]
    assert "hold the c axis" in layer_refusal(norm, Layout.parse("c2"))  # a LayerNorm over split channels
    from cost_models.local_problem import local_problem

    problem = local_problem(graph.nodes[linear], Layout.parse("n2·c2"), 8, "float64")
    assert problem.input_shapes == ((2, 4, 4, 8),) and problem.output_shape == (2, 4, 4, 16)  # channels read whole
    functional = {**graph.nodes[linear], "attrs": {**graph.nodes[linear]["attrs"], "function_form": True}}
    assert "function call" in layer_refusal(functional, Layout.parse("c2"))


# --- several ranks ----------------------------------------------------------------------------------------


def _cases(rank: int, world: int, cases: Sequence[tuple[str, str]]) -> dict[str, dict[str, str]]:
    return step_cases(cases, world, _model, lambda name: SHAPE, seed=SEED)


@pytest.mark.multirank
def test_channels_last_blocks_equal_the_unsplit_model_on_two_ranks() -> None:
    cases = [(name, layout) for name in MODELS for layout in ("h2", "w2")] + [("channels_last", "c2"), ("convnext", "c2")]
    cases.remove(("gated", "w2"))
    results = run_ranks(_cases, 2, args=(cases,), timeout_s=300)[0]
    for layout in ("h2", "w2"):
        split = results[f"channels_last {layout}"]
        assert [split[name] for name in ("permute", "norm", "up", "down", "mul", "movedim", "layer_norm")] == \
            [layout] * 7
        assert sum(value == layout for value in results[f"convnext {layout}"].values()) >= \
            len(results[f"convnext {layout}"]) - 8
    assert results["channels_last c2"]["norm"] == "n1"  # a LayerNorm over split channels runs whole
    assert [results["channels_last c2"][name] for name in ("up", "down", "mul")] == ["c2"] * 3  # filters split
    assert results["convnext c2"]["features_1_0_block_3"] == "c2"
    assert set(results["gated h2"].values()) == {"h2", "n1"} and results["gated h2"]["cat"] == "h2"


@pytest.mark.multirank
def test_channels_last_blocks_equal_the_unsplit_model_on_four_ranks() -> None:
    results = run_ranks(_cases, 4, args=([("convnext", "h2·w2"), ("convnext", "n2·h2")],), timeout_s=300)[0]
    assert results["convnext h2·w2"]["features_1_0_block_2"] == "h2·w2"
