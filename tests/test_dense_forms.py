"""Megatron-LM's pair: a channels-last linear layer reading its input split as its own filters runs its row form,
priced on its input edge as the runtime runs it (float64 equality: ``test_model_zoo_short``'s ViT under ``c2``)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from calibrate.presets import preset_cluster, preset_profile
from cost_models.dense_forms import column_form_s, form_s, reads_in_row_form, row_form, row_form_s
from cost_models.edges import edge_free, edge_move, edge_s
from cost_models.ir.tracing import trace
from cost_models.layout import Layout
from examples.vit import vit_tiny
from parplan.cli.layouts import layout_plan
from planner.edge_costs import EdgeCosts

DEVICES = 4
LAYOUTS = tuple(Layout.parse(text) for text in ("n4", "c2", "n2·c2", "c4", "c2·w2", "w4"))


@pytest.fixture(scope="module")
def graph():  # noqa: ANN201 - vit_tiny's LayerGraph
    return trace(vit_tiny(), (4, 3, 64, 64))


def _mlp(graph, which: int) -> tuple[str, str]:  # noqa: ANN001 - the edge into the first block's fc1 (0) or fc2 (3)
    target = f"encoder_layers_encoder_layer_0_mlp_{which}"
    return next(iter(graph.predecessors(target))), target


def test_the_second_linear_layer_of_a_pair_reads_its_input_where_it_is(graph) -> None:  # noqa: ANN001
    plan = layout_plan(graph, Layout(c=2))
    row = sorted(name for name in plan.layers if reads_in_row_form(name, plan, graph))
    assert row == ["encoder_layers_encoder_layer_0_mlp_3", "encoder_layers_encoder_layer_1_mlp_3"]  # fc2, not fc1
    source, target = _mlp(graph, 3)
    for other in (Layout(n=2, c=2), Layout(c=2, w=2)):  # the producer holds another layout: the column form
        assert not row_form(graph.nodes[source], graph.nodes[target], other, Layout(c=2))
    staged = SimpleNamespace(layers={**plan.layers, target: replace(plan.layers[target], stage=1)})
    assert not reads_in_row_form(target, staged, graph)  # a producer in another stage: received whole in channels


def test_the_row_form_is_priced_on_its_edge_instead_of_a_gather(graph) -> None:  # noqa: ANN001
    profile, cluster = preset_profile("h100"), preset_cluster("h100", DEVICES)
    src, dst = (graph.nodes[name] for name in _mlp(graph, 3))
    c2 = Layout(c=2)
    assert edge_move(src, dst, c2, c2) is None and not edge_free(src, dst, c2, c2)
    row = edge_s(src, dst, c2, c2, DEVICES, profile, cluster, 4)
    assert row == row_form_s(dst, c2, profile, cluster, 4) > 0
    gathered = edge_s(src, dst, Layout(n=2, c=2), c2, DEVICES, profile, cluster, 4)
    assert gathered > column_form_s(dst, c2, profile, cluster, 4) > 0  # a move, and the input-gradient sum
    assert row < edge_s(src, dst, Layout(c=2, w=2), c2, DEVICES, profile, cluster, 4)  # fc2: 64 in, 32 out
    assert form_s(src, dst, c2, Layout(n=4), profile, cluster, 4) == 0.0  # no filter split, no form


@pytest.mark.parametrize("which", [0, 3])
def test_edge_matrices_equal_each_edge_priced_alone(graph, which: int) -> None:  # noqa: ANN001
    profile, cluster = preset_profile("h100"), preset_cluster("h100", DEVICES)
    source, target = _mlp(graph, which)
    costs = EdgeCosts(graph, profile, cluster, DEVICES, 4)
    matrix = costs.matrix(source, target, LAYOUTS, LAYOUTS)
    alone = np.array([[edge_s(graph.nodes[source], graph.nodes[target], have, layout, DEVICES, profile, cluster, 4)
                       for layout in LAYOUTS] for have in LAYOUTS])
    np.testing.assert_allclose(matrix, alone, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(costs.pairs(source, target, LAYOUTS, LAYOUTS), np.diagonal(alone), rtol=1e-12)


def test_a_dimension_holding_no_axis_is_whole_in_the_forms_sizes() -> None:
    """EdgeNeXt's ``(N, H, ·, C)`` values (order ``nh.c``): the dimension holding no axis counts whole."""
    profile, cluster = preset_profile("h100"), preset_cluster("h100", DEVICES)
    layer = {"kind": "linear", "input_shapes": [[4, 8, 6, 16]], "output_shape": [4, 8, 6, 32],
             "attrs": {"input_orders": ["nh.c"], "order": "nh.c"}}
    source = {"kind": "activation", "output_shape": [4, 8, 6, 16], "attrs": {"order": "nh.c"}}
    layout = Layout(n=2, c=2)
    assert form_s(source, layer, layout, layout, profile, cluster, 4) == row_form_s(layer, layout, profile, cluster, 4)
    whole = row_form_s(layer, Layout(c=2), profile, cluster, 4)
    assert 0 < row_form_s(layer, layout, profile, cluster, 4) < whole  # half the samples: half the bytes
