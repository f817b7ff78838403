"""Tier 2: cutting traced models into stages, plans cut by rule, and the pipelines the runtime refuses."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import build_model

from cost_models.cluster import Cluster, Link
from cost_models.errors import InputError, PlanError
from cost_models.ir.graph import LayerGraph
from cost_models.ir.tracing import symbolic_trace, trace
from cost_models.layout import Layout
from cost_models.uniform import balanced_starts, staged, uniform_plan
from runtime.pipeline.cut import cut_stages
from runtime.pipeline.stage import check_pipeline

SHAPE = (4, 3, 40, 36)


@pytest.fixture(scope="module")
def resnet() -> tuple[torch.nn.Module, list[torch.fx.Node], object]:
    model = build_model("resnet18")
    return model, list(symbolic_trace(model, ()).graph.nodes), trace(model, SHAPE, torch.float32)


def _stages(nodes: list[torch.fx.Node], starts: list[str]) -> dict[str, int]:
    names = [n.name for n in nodes if n.op not in ("placeholder", "output")]
    positions = [names.index(start) for start in starts]
    return {name: sum(i >= p for p in positions) for i, name in enumerate(names)}


def test_a_cut_inside_a_residual_block_sends_the_skip_connection(resnet: tuple) -> None:
    _, nodes, _ = resnet
    first, second = cut_stages(nodes, _stages(nodes, ["layer1_0_bn1"]), 2)
    assert first.nodes[0] == "x" and first.nodes[-1] == "layer1_0_conv1" and second.nodes[-1] == "output"
    assert [c.name for c in second.receives] == ["maxpool", "layer1_0_conv1"]  # the block's input goes to its add
    assert first.sends == second.receives and all(c.consumers == (1,) for c in first.sends)


def test_a_skip_connection_over_two_cuts_goes_straight_to_its_reader(resnet: tuple) -> None:
    _, nodes, _ = resnet
    cuts = cut_stages(nodes, _stages(nodes, ["layer1_0_conv2", "layer1_0_bn2"]), 3)
    skip = next(c for c in cuts[0].sends if c.name == "maxpool")
    assert skip.consumers == (2,) and skip in cuts[2].receives and skip not in cuts[1].receives


def test_stages_out_of_order_are_refused_with_the_layer_named(resnet: tuple) -> None:
    _, nodes, _ = resnet
    stage_of = _stages(nodes, ["layer2_0_conv1"])
    stage_of["layer3_0_conv1"] = 0
    with pytest.raises(PlanError, match="layer 'layer3_0_conv1' is on stage 0 but comes after"):
        cut_stages(nodes, stage_of, 2)


def test_balanced_starts_split_the_work_and_staged_plans_follow_them(resnet: tuple) -> None:
    _, _, graph = resnet
    starts = balanced_starts(graph, 4)
    order = graph.compute_layers()
    assert len(starts) == 3 and [order.index(s) for s in starts] == sorted(order.index(s) for s in starts)
    link = Link(1e-6, 1e9)
    plan = uniform_plan(graph, Cluster(2, 2, 2**34, link, link), [Layout(h=2), Layout()])
    cut = staged(plan, graph, starts, "stale")
    assert cut.pipeline.stages == 4 and cut.pipeline.staleness == (6, 4, 2, 0) and cut.cluster.devices == 8
    assert [cut.layers[name].stage for name in starts] == [1, 2, 3]
    with pytest.raises(InputError, match="must be distinct layers after the first"):
        staged(plan, graph, [starts[1], starts[0]])
    with pytest.raises(InputError, match="are not layers of the model"):
        staged(plan, graph, ["nowhere"])


def test_balanced_starts_cut_every_stage_count_around_one_heavy_layer() -> None:
    """One layer holding nearly all the work, anywhere in the model: every stage count from 1 to the number
    of layers gets distinct, ordered cuts (a heavy layer late left no room and indexed past the end)."""
    from cost_models.ir.layer import Layer

    for heavy in range(6):
        graph = LayerGraph(input_shape=[2, 4], dtype="float32", outputs=["l5"])
        graph.add_node("x", Layer(kind="input", target="x", output_shape=[2, 4]))
        for index in range(6):
            flops = 10**9 if index == heavy else 10
            graph.add_node(f"l{index}", Layer(kind="linear", target="fc", output_shape=[2, 4], flops_fwd=flops,
                                              flops_bwd=flops))
            graph.add_edge("x" if index == 0 else f"l{index - 1}", f"l{index}")
        order = graph.compute_layers()
        for stages in range(1, 7):
            positions = [order.index(name) for name in balanced_starts(graph, stages)]
            assert len(positions) == stages - 1 and positions == sorted(set(positions)) and 0 not in positions, \
                (heavy, stages, positions)


def test_pipelines_the_runtime_cannot_run_are_refused(resnet: tuple) -> None:
    _, _, graph = resnet
    link = Link(1e-6, 1e9)
    plan = staged(uniform_plan(graph, Cluster(1, 1, 2**34, link, link), [Layout()]), graph, ["layer3_0_conv1"],
                  "stale", staleness=(0, 1))
    with pytest.raises(PlanError, match=r"staleness \[0, 1\] grows"):
        check_pipeline(plan)
    sync = replace(plan.pipeline, schedule="sync", staleness=(0, 0))
    check_pipeline(replace(plan, pipeline=replace(sync, micro_batches=3)))  # 2 + 1 + 1 samples run
    with pytest.raises(PlanError, match="5 micro-batches of a batch of 4: each needs at least one sample"):
        check_pipeline(replace(plan, pipeline=replace(sync, micro_batches=5)))
    unequal = replace(plan, cluster=replace(plan.cluster, devices=3),
                      pipeline=replace(plan.pipeline, devices_per_stage=(1, 2), staleness=(1, 0)))
    check_pipeline(unequal)  # stages of 1 and 2 devices run (tests/test_runtime_pipeline.py)


class _Twice(torch.nn.Module):
    """One convolution applied twice: its weight would live on two stages if they were cut apart."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 3, padding=1)
        self.relu = torch.nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.relu(self.conv(x)))


def test_a_parameter_used_on_two_stages_is_refused() -> None:
    from runtime.pipeline.setup import refuse_shared_parameters

    model = _Twice()
    nodes = list(symbolic_trace(model, ()).graph.nodes)
    cuts = cut_stages(nodes, {"conv": 0, "relu": 0, "conv_1": 1}, 2)
    with pytest.raises(PlanError, match="parameter conv.weight is used on stages 0 and 1"):
        refuse_shared_parameters(model, nodes, cuts)
    refuse_shared_parameters(model, nodes, cut_stages(nodes, {"conv": 0, "relu": 0, "conv_1": 0}, 2))


class _DeviceRead(torch.nn.Module):
    """A position ramp made where the activation lives (``device=y.device``), on both sides of a cut: Hugging
    Face's Swin reads ``x.device`` once for two ``torch.arange`` calls."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(x)
        where = y.device
        y = self.conv2(y + torch.arange(y.shape[-1], device=where, dtype=y.dtype))
        return y * torch.arange(y.shape[-2], device=where, dtype=y.dtype)[:, None]


def test_a_device_read_is_made_on_every_stage_not_sent() -> None:
    """A device crossed a cut as a value no stage can send ('getattr_2' … only layers' tensors can cross a cut:
    every planned pipeline of HF Swin); every stage reads its own device now (``runtime.shapes.static_values``)."""
    from runtime.shapes import static_nodes, static_values, tensor_names

    model = _DeviceRead()
    graph = trace(model, (2, 3, 8, 8), torch.float32)
    nodes = list(symbolic_trace(model, (), shapes=[(2, 3, 8, 8)]).graph.nodes)
    static = static_nodes(nodes, tensor_names(graph))
    reads = [node.name for node in static if node.target is getattr and node.args[1] == "device"]
    stage_of = {name: stage for name, stage in _stages(nodes, ["conv2"]).items() if name in graph.nodes}
    with pytest.raises(PlanError, match="only layers' tensors can cross a cut"):
        cut_stages(nodes, stage_of, 2)  # as the pipeline cut it before
    (first, second) = cut_stages(nodes, stage_of, 2, static=frozenset(node.name for node in static))
    assert reads and not any(c.name in reads for c in second.receives)
    values = static_values(static, lambda name: graph.nodes[name].output_shape, device=torch.device("cpu"))
    assert all(values[name] == torch.device("cpu") for name in reads)


def test_a_scalar_crossing_a_cut_keeps_no_dimension() -> None:
    """diffusers' ``VQModel`` returns its commitment loss (a scalar) and a 4-stage plan sends it on; its
    gradient came back as ``(1,)`` and autograd refused it for ``()`` after the ranks started."""
    from runtime._values import local_shape
    from runtime.placement import Placement

    for layout in (Layout(), Layout(n=2), Layout(h=2)):
        assert all(local_shape([], Placement(layout), member) == () for member in range(layout.ranks))
    assert local_shape([4, 3, 8, 8], Placement(Layout(n=2)), 1) == (2, 3, 8, 8)


def test_an_integer_value_crossing_a_cut_travels_in_its_own_dtype() -> None:
    """HF Swin's relative-position index (``int64``) crossed a 2-stage cut; the receiver allocated it as float32,
    half its bytes, and gloo aborted the rank ("Received data size doesn't match expected size")."""
    from runtime.pipeline.stage import value_dtype

    graph = trace(_DeviceRead(), (2, 3, 8, 8), torch.float32)
    assert "output_dtype" not in graph.nodes["arange"].attrs  # a float ramp travels in the activations' dtype
    indices = trace(_Indices(), (2, 3, 8, 8), torch.float32)
    assert indices.nodes["arange"].attrs["output_dtype"] == "int64"
    assert value_dtype(indices, "arange", torch.float64) == torch.int64
    assert value_dtype(indices, "conv", torch.float64) == torch.float64


class _Indices(torch.nn.Module):
    """A gathered row picked by an index built from the shape (an ``int64`` layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        order = torch.arange(x.shape[-1] - 1, -1, -1)
        return self.conv(x)[..., order]
