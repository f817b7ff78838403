"""Tier 1: FLOP formulas on hand-computed shapes (no torch)."""

from __future__ import annotations

from cost_models.ir.flops import Flops, layer_flops


def test_convolution_counts_multiply_add_as_two() -> None:
    # 3x3 conv, 16 -> 32 channels, on 2 images of 10x10 ('same' padding).
    attrs = {"weight_shape": [32, 16, 3, 3], "transposed": False}
    flops = layer_flops("conv", [[2, 16, 10, 10]], [2, 32, 10, 10], attrs, needs_input_grad=True, has_weight=True)
    forward = 2 * 2 * 32 * 10 * 10 * 16 * 9
    assert flops == Flops(forward, forward, forward)
    assert flops.bwd == 2 * forward


def test_grouped_convolution_uses_channels_per_group() -> None:
    attrs = {"weight_shape": [32, 1, 3, 3], "transposed": False, "groups": 32}  # depthwise
    flops = layer_flops("conv", [[1, 32, 8, 8]], [1, 32, 8, 8], attrs, needs_input_grad=True, has_weight=True)
    assert flops.fwd == 2 * 32 * 64 * 9


def test_first_layer_needs_no_backward_data() -> None:
    attrs = {"weight_shape": [8, 3, 7, 7], "transposed": False}
    flops = layer_flops("conv", [[1, 3, 32, 32]], [1, 8, 16, 16], attrs, needs_input_grad=False, has_weight=True)
    assert flops.bwd_data == 0 and flops.bwd_weight == flops.fwd > 0


def test_transposed_convolution_counts_input_points() -> None:
    attrs = {"weight_shape": [16, 8, 2, 2], "transposed": True}  # (C_in, C_out/groups, k, k)
    flops = layer_flops("conv_transpose", [[1, 16, 5, 5]], [1, 8, 10, 10], attrs, needs_input_grad=True, has_weight=True)
    assert flops.fwd == 2 * 25 * 4 * 16 * 8


def test_linear_over_leading_dimensions() -> None:
    flops = layer_flops("linear", [[4, 7, 512]], [4, 7, 10], {"weight_shape": [10, 512]},
                        needs_input_grad=True, has_weight=True)
    assert flops == Flops(2 * 28 * 512 * 10, 2 * 28 * 512 * 10, 2 * 28 * 512 * 10)


def test_pooling_and_elementwise() -> None:
    pool = layer_flops("maxpool", [[1, 4, 8, 8]], [1, 4, 4, 4], {"kernel_size": 3}, needs_input_grad=True, has_weight=False)
    assert pool == Flops(64 * 9, 64 * 9, 0)
    relu = layer_flops("activation", [[1, 4, 8, 8]], [1, 4, 8, 8], {}, needs_input_grad=False, has_weight=False)
    assert relu == Flops(256, 0, 0)
    view = layer_flops("flatten", [[1, 4, 8, 8]], [1, 256], {}, needs_input_grad=True, has_weight=False)
    assert view == Flops(0, 0, 0)


def test_flops_grow_with_the_problem() -> None:
    attrs = {"weight_shape": [8, 8, 3, 3], "transposed": False}
    small = layer_flops("conv", [[1, 8, 8, 8]], [1, 8, 8, 8], attrs, needs_input_grad=True, has_weight=True)
    large = layer_flops("conv", [[2, 8, 16, 8]], [2, 8, 16, 8], attrs, needs_input_grad=True, has_weight=True)
    assert large.fwd == 4 * small.fwd
