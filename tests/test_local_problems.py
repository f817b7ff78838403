"""Tier 2: the local problems calibration enumerates, checked by hand on a small model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from calibrate.problems import enumerate_problems
from cost_models.ir.tracing import trace
from cost_models.layout import Layout, layouts_dividing
from cost_models.local_problem import local_problem, phases_of

SHAPE = (4, 3, 16, 16)


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.bn(self.conv1(x))))
        return self.fc(torch.flatten(self.conv2(x), 1))


@pytest.fixture(scope="module")
def graph():  # noqa: ANN201
    return trace(Small(), SHAPE)


def problem(graph, name: str, layout: Layout):  # noqa: ANN001, ANN201
    return local_problem(graph.nodes[name], layout, 4, "float32")


def test_layouts_dividing() -> None:
    assert layouts_dividing(1) == [Layout()]
    assert {str(layout) for layout in layouts_dividing(2)} == {"n1", "n2", "c2", "h2", "w2"}
    four = layouts_dividing(4)
    assert len(four) == 15 and Layout(h=2, w=2) in four and Layout(n=4) in four


def test_spatial_split_reads_a_halo_and_drops_padding(graph) -> None:  # noqa: ANN001
    p = problem(graph, "conv1", Layout(h=2))
    assert p.output_shape == (4, 8, 8, 16)
    assert p.input_shapes == ((4, 3, 10, 16),)  # 8 rows + 1 halo row each side
    assert dict(p.attrs)["padding"] == (0, 1)
    assert p.flops.fwd == 2 * 4 * 8 * 8 * 16 * 3 * 9
    assert p.flops.bwd_data == 0  # first layer: no input gradient


def test_strided_convolution_under_a_width_split(graph) -> None:  # noqa: ANN001
    p = problem(graph, "conv2", Layout(w=2))
    assert p.output_shape == (4, 8, 4, 2)
    assert p.input_shapes == ((4, 8, 8, 5),)  # (2-1)*2 + 3 columns
    assert dict(p.attrs)["padding"] == (1, 0)
    assert phases_of(p) == ("fwd", "bwd_data", "bwd_weight")


def test_channel_split_divides_filters_not_inputs(graph) -> None:  # noqa: ANN001
    p = problem(graph, "conv1", Layout(c=2))
    assert p.weight_shape == (4, 3, 3, 3)
    assert p.input_shapes == ((4, 3, 16, 16),) and p.output_shape == (4, 4, 16, 16)
    bn = problem(graph, "bn", Layout(c=2))
    assert bn.input_shapes == ((4, 4, 16, 16),) and bn.weight_shape == (4,)


def test_pooling_window_and_sample_split(graph) -> None:  # noqa: ANN001
    pooled = problem(graph, "pool", Layout(h=2))
    assert pooled.output_shape == (4, 8, 4, 8) and pooled.input_shapes == ((4, 8, 8, 16),)
    assert problem(graph, "conv1", Layout(n=2)).input_shapes == ((2, 3, 16, 16),)


def test_linear_layers_split_samples_and_features_only(graph) -> None:  # noqa: ANN001
    assert problem(graph, "fc", Layout(n=2)).input_shapes == ((2, 128),)
    assert problem(graph, "fc", Layout(c=2)).weight_shape == (5, 128)
    assert problem(graph, "fc", Layout(h=2)) is None
    assert problem(graph, "flatten", Layout()) is None


def test_impossible_splits_are_left_out(graph) -> None:  # noqa: ANN001
    assert problem(graph, "conv1", Layout(n=8)) is None  # 4 samples
    assert problem(graph, "conv2", Layout(h=8)) is None  # 4 output rows


def test_enumeration_deduplicates_and_counts(graph) -> None:  # noqa: ANN001
    single = enumerate_problems(graph, [1])
    keys = {(m.problem.key, m.phase) for m in single}
    assert len(keys) == len(single)
    assert {m.problem.kind for m in single} == {"conv", "batchnorm", "activation", "maxpool", "linear"}
    both = enumerate_problems(graph, [1, 2])
    assert len(both) > len(single)


def test_a_tile_reading_zero_rows_of_its_padding_has_a_local_problem() -> None:
    """alexnet's 5×5, padding-2 convolution on a 7×7 map under h2: a 4-row tile reads 8 rows, two of them the
    padding's zeros (the capability predicate admits it and the runtime runs it, so the cost model prices it)."""
    from cost_models.capability.predicate import layer_refusal
    from cost_models.layout import Layout
    from cost_models.local_problem import local_problem

    layer = {"kind": "conv", "input_shapes": [[4, 64, 7, 7]], "output_shape": [4, 192, 7, 7],
             "weight_shape": [192, 64, 5, 5], "attrs": {"kernel_size": [5, 5], "stride": [1, 1], "padding": [2, 2],
                                                       "dilation": [1, 1], "groups": 1, "padding_mode": "zeros"}}
    assert layer_refusal(layer, Layout(h=2)) is None
    problem = local_problem(layer, Layout(h=2), 4, "float32")
    assert problem is not None and problem.input_shapes == ((4, 64, 8, 7),) and problem.output_shape == (4, 192, 4, 7)
