"""Tier 1: the capability predicate's rules registered per kind (cost_models.capability.registry)."""

from __future__ import annotations

import pytest

from cost_models.capability.predicate import CHANNEL_KINDS, SPATIAL_KINDS, layer_refusal
from cost_models.capability.registry import CHANNEL_RULES, SPATIAL_RULES, KindRules
from cost_models.ir.kinds import KINDS
from cost_models.ir.layer import Layer
from cost_models.layout import Layout


def test_every_registered_kind_is_a_layer_kind_the_split_can_reach() -> None:
    assert SPATIAL_RULES.kinds() <= KINDS & SPATIAL_KINDS | {"conv_transpose"}
    assert CHANNEL_RULES.kinds() <= KINDS & CHANNEL_KINDS
    assert {"conv", "maxpool", "avgpool", "upsample", "pad", "norm"} <= SPATIAL_RULES.kinds()
    assert {"conv", "flatten", "softmax", "view", "pad"} <= CHANNEL_RULES.kinds()


def test_a_kind_has_one_rule_and_a_kind_without_one_refuses_nothing() -> None:
    rules = KindRules("test split")

    @rules.register("softmax")
    def softmax(layer: Layer, layout: Layout) -> str | None:
        return "no"

    with pytest.raises(ValueError, match="already have a rule"):
        rules.register("softmax", "add")(softmax)
    assert rules.refusal(Layer(kind="softmax"), Layout(c=2)) == "no"
    assert rules.refusal(Layer(kind="add"), Layout(c=2)) is None


def test_the_predicate_finds_a_kinds_rule_through_the_table() -> None:
    """A grouped convolution's channel rule (channels.py) and softmax's spatial one (spatial.py), via the predicate."""
    grouped = Layer(kind="conv", input_shapes=[[4, 6, 8, 8]], output_shape=[4, 6, 8, 8], weight_shape=[6, 2, 3, 3],
                    params=108, attrs={"kernel_size": [3, 3], "stride": [1, 1], "padding": [1, 1],
                                       "dilation": [1, 1], "groups": 3, "padding_mode": "zeros"})
    assert layer_refusal(grouped, Layout(c=2)) == "3 groups and 6 filters do not split evenly into 2 channel parts"
    assert layer_refusal(grouped, Layout(c=3)) is None
    softmax = Layer(kind="softmax", input_shapes=[[4, 6, 8, 8]], output_shape=[4, 6, 8, 8], attrs={"dim": -1})
    assert layer_refusal(softmax, Layout(h=2)) == "softmax across tiles must be over the channels (dim=1)"
