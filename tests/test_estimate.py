"""Tier 1–2: the whole-plan estimate — known answers on a hand-built graph, properties, and `parplan estimate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.cluster import Cluster, Link
from cost_models.errors import PlanError
from cost_models.estimate import estimate
from cost_models.graph import LayerGraph, compute_fingerprint
from cost_models.layout import Layout
from cost_models.plan import LayerAssignment, Pipeline, Plan, save_plan
from cost_models.profile import CommFit, ComputeFit, DeviceSpec, Profile
from planner.cli import main

ALPHA, BETA = 1e-5, 1e-9
PROFILE = Profile(
    DeviceSpec("test", 2**34), {"source": "measured"},
    compute_fits=tuple(ComputeFit("*", phase, 0.0, 1e-10, 0.0, 3) for phase in ("fwd", "bwd", "bwd_data", "bwd_weight")),
    comm_fits=tuple(CommFit(c, level, ALPHA, BETA, 3) for c in ("allreduce", "allgather", "reduce_scatter",
                                                                 "all_to_all", "sendrecv") for level in ("intra", "inter")),
)


def cluster(devices: int) -> Cluster:
    return Cluster(devices=devices, devices_per_node=8, memory_bytes=2**34, intra=Link(ALPHA, 1 / BETA),
                   inter=Link(ALPHA, 1 / BETA))


def conv_graph(batch: int = 8) -> LayerGraph:
    """input -> 3x3 conv (16->16 channels, 32x32, padding 1) -> relu."""
    graph = LayerGraph(input_shape=[batch, 16, 32, 32], dtype="float32", outputs=["relu"])
    shape = [batch, 16, 32, 32]
    graph.add_node("x", kind="input", output_shape=shape, input_shapes=[], params=0, attrs={})
    graph.add_node("conv", kind="conv", output_shape=shape, input_shapes=[shape], params=16 * 16 * 9,
                   weight_shape=[16, 16, 3, 3], needs_input_grad=True, has_weight=True, requires_grad=True,
                   attrs={"kernel_size": [3, 3], "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1],
                          "groups": 1, "transposed": False, "weight_shape": [16, 16, 3, 3]})
    graph.add_node("relu", kind="activation", output_shape=shape, input_shapes=[shape], params=0,
                   needs_input_grad=True, has_weight=False, requires_grad=True, attrs={"function": "ReLU"})
    graph.add_edges_from([("x", "conv"), ("conv", "relu")])
    graph.graph["fingerprint"] = compute_fingerprint(graph)
    return graph


def plan_for(graph: LayerGraph, devices: int, layouts: dict[str, Layout]) -> Plan:
    return Plan(graph.fingerprint, tuple(graph.input_shape), "float32", cluster(devices),  # type: ignore[arg-type]
                {name: LayerAssignment(layout) for name, layout in layouts.items()}, Pipeline(1, (devices,)))


def test_single_device_is_pure_compute() -> None:
    graph = conv_graph()
    result = estimate(graph, plan_for(graph, 1, {"conv": Layout(), "relu": Layout()}), PROFILE)
    conv_flops = 2 * 8 * 16 * 32 * 32 * 16 * 9
    relu_elements = 8 * 16 * 32 * 32
    expected = (3 * conv_flops + 2 * relu_elements) * 1e-10
    assert result.iteration_s == pytest.approx(expected)
    assert result.breakdown_s["allreduce"] == 0 and result.breakdown_s["halo"] == 0
    assert result.sources() == {"fitted": 2}


def test_sample_split_adds_an_allreduce_that_overlaps() -> None:
    graph = conv_graph()
    layouts = {"conv": Layout(n=2), "relu": Layout(n=2)}
    overlapped = estimate(graph, plan_for(graph, 2, layouts), PROFILE)
    serial = estimate(graph, plan_for(graph, 2, layouts), PROFILE, overlap=False)
    weight_bytes = 16 * 16 * 9 * 4
    ring = 2 * ALPHA + weight_bytes * BETA  # 2(p-1)α + 2(p-1)/p·n·β with p = 2
    assert overlapped.breakdown_s["allreduce"] == pytest.approx(ring)
    assert serial.iteration_s == pytest.approx(overlapped.breakdown_s["compute_fwd"]
                                               + overlapped.breakdown_s["compute_bwd"] + ring)
    assert overlapped.iteration_s <= serial.iteration_s


def test_spatial_split_pays_halo_and_redistribution() -> None:
    graph = conv_graph()
    result = estimate(graph, plan_for(graph, 2, {"conv": Layout(h=2), "relu": Layout(n=2)}), PROFILE, overlap=False)
    halo_bytes = 8 * 16 * 32 * 4  # one row of 32 columns, 8 samples x 16 channels, float32
    assert result.breakdown_s["halo"] == pytest.approx(2 * (ALPHA + halo_bytes * BETA))
    assert result.breakdown_s["halo_exposed"] == pytest.approx(result.breakdown_s["halo"])
    # conv (h2) -> relu (n2): each rank holds half the rows of all samples, wants all rows of half the samples.
    moved_bytes = 4 * 16 * 16 * 32 * 4
    assert result.breakdown_s["redistribution"] == pytest.approx(2 * (ALPHA + moved_bytes * BETA))


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from(["sgd", "momentum", "adam"]))
def test_terms_are_non_negative_and_sample_splits_shrink_memory(devices: int, optimizer: str) -> None:
    graph = conv_graph()
    one = estimate(graph, plan_for(graph, 1, {"conv": Layout(), "relu": Layout()}), PROFILE, optimizer=optimizer)
    many = estimate(graph, plan_for(graph, devices, {"conv": Layout(n=devices), "relu": Layout(n=devices)}), PROFILE,
                    optimizer=optimizer)
    assert all(value >= 0 for value in many.breakdown_s.values())
    assert many.memory_bytes_max <= one.memory_bytes_max
    assert many.memory_bytes["weights"] == one.memory_bytes["weights"]


def test_refusals() -> None:
    graph = conv_graph()
    with pytest.raises(PlanError, match=r"layout n16 of layer 'conv' splits its output \(8, 16, 32, 32\) into empty"):
        estimate(graph, plan_for(graph, 16, {"conv": Layout(n=16), "relu": Layout(n=16)}), PROFILE)
    other = conv_graph(batch=4)
    with pytest.raises(PlanError, match="fingerprint"):
        estimate(other, plan_for(graph, 1, {"conv": Layout(), "relu": Layout()}), PROFILE)


def test_estimate_command_on_resnet50_with_a_hand_written_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from calibrate.presets import preset_cluster
    from conftest import build_model
    from cost_models.graph import trace

    shape = (64, 3, 2048, 2048)
    graph = trace(build_model("resnet50"), shape)
    layouts = {name: Layout(n=16, h=2, w=2) if len(graph.nodes[name]["output_shape"]) == 4
               and graph.nodes[name]["output_shape"][2] >= 2 else Layout(n=64) for name in graph.compute_layers()}
    plan = Plan(graph.fingerprint, shape, "float32", preset_cluster("h100", 64),
                {name: LayerAssignment(layout) for name, layout in layouts.items()}, Pipeline(1, (64,)))
    save_plan(plan, tmp_path / "plan.json")
    code = main(["estimate", "--model", "torchvision:resnet50", "--input-shape", "64,3,2048,2048",
                 "--plan", str(tmp_path / "plan.json"), "--profile", "h100", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    document = json.loads(out)
    assert document["iteration_s"] > document["breakdown_s"]["compute_fwd"] > 0
    assert document["breakdown_s"]["halo"] > 0 and document["breakdown_s"]["allreduce"] > 0
    assert len(document["layers"]) == 175 and document["memory_bytes_max"] > 0
    assert main(["estimate", "--model", "torchvision:resnet50", "--input-shape", "32,3,2048,2048",
                 "--plan", str(tmp_path / "plan.json"), "--profile", "h100"]) == 2
    assert f"made for model fingerprint {graph.fingerprint}" in capsys.readouterr().err


def test_a_layout_the_kind_cannot_take_names_the_layer() -> None:
    graph = LayerGraph(input_shape=[8, 4, 1, 1], dtype="float32", outputs=["fc"])
    graph.add_node("x", kind="input", output_shape=[8, 4], input_shapes=[], params=0, attrs={})
    graph.add_node("fc", kind="linear", output_shape=[8, 10], input_shapes=[[8, 4]], params=50, weight_shape=[10, 4],
                   needs_input_grad=False, has_weight=True, requires_grad=True, attrs={"weight_shape": [10, 4]})
    graph.add_edge("x", "fc")
    graph.graph["fingerprint"] = compute_fingerprint(graph)
    with pytest.raises(PlanError, match=r"layout h2 cannot split layer 'fc' \(linear, output \(8, 10\)\)"):
        estimate(graph, plan_for(graph, 2, {"fc": Layout(h=2)}), PROFILE)
    assert estimate(graph, plan_for(graph, 2, {"fc": Layout(c=2)}), PROFILE).iteration_s > 0
