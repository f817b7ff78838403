"""Models taking several tensors (``forward(x, cond)``): tracing, the command line, plan files (single process).

The model is ``examples/conditioned_cnn.py``: an image ``(N, 3, H, W)`` and a
condition ``(N, 8)`` that a linear layer turns into one bias per channel of
the first convolution's feature map.
"""

from __future__ import annotations

import json

import pytest

from conftest import SMALL_SHAPE, build_model
from cost_models.errors import InputError
from cost_models.graph import LayerGraph, compute_fingerprint, parse_input_shapes, trace
from examples.conditioned_cnn import conditioned_cnn

SHAPES = ((4, 3, 16, 16), (4, 8))


def build_model_with_condition(size: int):  # noqa: ANN201 - an nn.Module
    """The example model with a condition of ``size`` values."""
    from examples.conditioned_cnn import ConditionedCNN

    return ConditionedCNN(condition=size)


def test_two_inputs_trace_to_two_input_nodes_in_argument_order() -> None:
    graph = trace(conditioned_cnn(), SHAPES)
    assert graph.inputs() == ["x", "cond"]
    assert graph.input_shapes == SHAPES and graph.input_shape == SHAPES[0]
    assert [graph.nodes[name]["output_shape"] for name in graph.inputs()] == [list(s) for s in SHAPES]
    assert graph.nodes["lin"]["input_shapes"] == [[4, 8]] and graph.nodes["lin"]["output_shape"] == [4, 16]
    assert graph.nodes["add"]["input_shapes"] == [[4, 16, 16, 16], [4, 16, 1, 1]]
    assert list(graph.predecessors("lin")) == ["cond"] and list(graph.predecessors("conv1")) == ["x"]
    assert graph.nodes["head"]["output_shape"] == [4, 4, 16, 16]


def test_fingerprint_counts_every_input_shape() -> None:
    graph = trace(conditioned_cnn(), SHAPES)
    assert trace(conditioned_cnn(), SHAPES).fingerprint == graph.fingerprint
    other = trace(build_model_with_condition(5), ((4, 3, 16, 16), (4, 5)))
    assert other.fingerprint != graph.fingerprint
    round_tripped = LayerGraph.from_dict(json.loads(json.dumps(graph.to_dict())))
    assert round_tripped.input_shapes == SHAPES and round_tripped.inputs() == ["x", "cond"]
    assert compute_fingerprint(round_tripped) == graph.fingerprint


def test_single_input_graph_hashes_as_before() -> None:
    """The second shape enters the fingerprint only when there is one: one shape, one list, same hash."""
    model = build_model("resnet18")
    graph = trace(model, SMALL_SHAPE)
    assert graph.input_shapes == (SMALL_SHAPE,) and graph.inputs() == ["x"]
    assert trace(model, [SMALL_SHAPE]).fingerprint == graph.fingerprint
    del graph.graph["input_shapes"]  # a graph as older code wrote it
    assert compute_fingerprint(graph) == graph.fingerprint
    assert LayerGraph.from_dict({**graph.to_dict()} | {"input_shapes": [list(SMALL_SHAPE)]}).input_shapes == (SMALL_SHAPE,)


@pytest.mark.parametrize(("shapes", "words"), [
    (["4,3,16,16", "2,8"], ["2,8", "batch 2", "4,3,16,16", "batch 4"]),
    (["4,3,16"], ["N,C,H,W"]),
    (["4,3,16,16", "4,0"], ["positive"]),
    (["4,3,16,16", "4,x8"], ["not a list of integers"]),
])
def test_bad_input_shapes_are_named(shapes: list[str], words: list[str]) -> None:
    with pytest.raises(InputError) as info:
        parse_input_shapes(shapes)
    assert all(word in str(info.value) for word in words), str(info.value)


def test_shapes_must_fit_the_forward() -> None:
    with pytest.raises(InputError, match="add --input-shape for cond"):
        trace(conditioned_cnn(), SHAPES[0])
    with pytest.raises(InputError, match="takes 2 tensor argument"):
        trace(conditioned_cnn(), (*SHAPES, (4, 2)))
