"""Tier 1–2: the whole-plan estimate — known answers on a hand-built graph, properties, and `parplan estimate`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.cluster import Cluster, Link
from cost_models.comm_cost import GRADIENT_BUCKET_BYTES
from cost_models.errors import PlanError
from cost_models.estimate import estimate
from cost_models.formats.plan import LayerAssignment, Pipeline, Plan, save_plan
from cost_models.ir.graph import LayerGraph, compute_fingerprint
from cost_models.layout import Layout
from cost_models.memory import LayerMemory, StepLayer, distinct_saved_bytes, stage_peak_bytes
from cost_models.profile import CommFit, ComputeFit, DeviceSpec, Profile
from parplan.cli import main

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
    bucket = GRADIENT_BUCKET_BYTES  # the weight's share of one bucket's ring: 2(p-1)α + 2(p-1)/p·B·β with p = 2
    ring = (2 * ALPHA + bucket * BETA) * weight_bytes / bucket
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


def test_a_cpu_exposes_the_halo_a_gpu_hides_behind_the_interior() -> None:
    """The runtime overlaps a tile's interior with its halos on GPUs only (``runtime.spatial.conv2d``): a CPU
    profile prices the exchange exposed, as ``overlap=False`` does; a GPU profile hides some of it."""
    graph = conv_graph()
    plan = plan_for(graph, 2, {"conv": Layout(h=2), "relu": Layout(n=2)})
    gpu = estimate(graph, plan, PROFILE)
    cpu = estimate(graph, plan, replace(PROFILE, device=DeviceSpec("CPU Test (2 cores)", 2**34)))
    assert not replace(PROFILE, device=DeviceSpec("CPU Test (2 cores)", 2**34)).overlaps_halos
    assert cpu.breakdown_s["halo_exposed"] == pytest.approx(cpu.breakdown_s["halo"])
    assert gpu.breakdown_s["halo_exposed"] < gpu.breakdown_s["halo"]


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
    from conftest import build_model

    from calibrate.presets import preset_cluster
    from cost_models.ir.tracing import trace

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


def chain_graph(depth: int = 4, batch: int = 8) -> LayerGraph:
    """input -> conv0 -> conv1 -> ... (3x3, 8 channels, 16x16, padding 1)."""
    shape = [batch, 8, 16, 16]
    graph = LayerGraph(input_shape=shape, dtype="float32", outputs=[f"conv{depth - 1}"])
    graph.add_node("x", kind="input", output_shape=shape, input_shapes=[], params=0, attrs={})
    previous = "x"
    for index in range(depth):
        name = f"conv{index}"
        graph.add_node(name, kind="conv", output_shape=shape, input_shapes=[shape], params=8 * 8 * 9,
                       weight_shape=[8, 8, 3, 3], needs_input_grad=index > 0, has_weight=True, requires_grad=True,
                       attrs={"kernel_size": [3, 3], "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1],
                              "groups": 1, "transposed": False, "weight_shape": [8, 8, 3, 3]})
        graph.add_edge(previous, name)
        previous = name
    graph.graph["fingerprint"] = compute_fingerprint(graph)
    return graph


def pipeline_plan(graph: LayerGraph, pipeline: Pipeline) -> Plan:
    layers = {f"conv{i}": LayerAssignment(Layout(), stage=0 if i < 2 else 1) for i in range(4)}
    return Plan(graph.fingerprint, tuple(graph.input_shape), "float32", cluster(2), layers, pipeline)  # type: ignore[arg-type]


def test_sync_pipeline_known_answer() -> None:
    graph = chain_graph()
    result = estimate(graph, pipeline_plan(graph, Pipeline(2, (1, 1), "sync", 2, (0, 0))), PROFILE)
    conv = 2 * 4 * 8 * 16 * 16 * 8 * 9 * 1e-10  # one pass of one conv on a micro-batch of 4
    forward, backward = 2 * conv, [3 * conv, 4 * conv]  # conv0 has no backward-data
    transfer = ALPHA + 4 * 8 * 16 * 16 * 4 * BETA
    # flow line of 2 micro-batches through stage0, link, stage1 and back
    expected = (forward + transfer + forward + max(forward, transfer)) + (
        backward[1] + transfer + backward[0] + max(backward + [transfer]))
    assert result.iteration_s == pytest.approx(expected)
    assert [s.transfer_s for s in result.stages] == [pytest.approx(transfer), 0.0]


def test_stale_pipeline_stashes_inputs_and_tolerates_a_straggler_better() -> None:
    graph = chain_graph()
    sync = pipeline_plan(graph, Pipeline(2, (1, 1), "sync", 1, (0, 0)))
    stale = pipeline_plan(graph, Pipeline(2, (1, 1), "stale", 1, (2, 0)))
    sync_result, stale_result = estimate(graph, sync, PROFILE), estimate(graph, stale, PROFILE)
    boundary = 8 * 8 * 16 * 16 * 4
    assert stale_result.stages[1].memory_bytes == sync_result.stages[1].memory_bytes
    assert stale_result.stages[0].memory_bytes == sync_result.stages[0].memory_bytes + 2 * boundary  # input batch
    assert stale_result.iteration_s < sync_result.iteration_s
    slow_sync = estimate(graph, sync, PROFILE, slowdown={1: 2.0}).iteration_s
    slow_stale = estimate(graph, stale, PROFILE, slowdown={1: 2.0}).iteration_s
    assert slow_sync > sync_result.iteration_s and slow_stale > stale_result.iteration_s
    assert slow_stale < slow_sync


def test_restaled_prices_another_staleness_as_a_full_estimate_does() -> None:
    from cost_models.estimate import restaled

    graph = chain_graph()
    capped = pipeline_plan(graph, Pipeline(2, (1, 1), "stale", 1, (2, 0)))
    for lags in ((0, 0), (1, 0), (2, 0)):
        plan = pipeline_plan(graph, Pipeline(2, (1, 1), "stale", 1, lags))
        assert restaled(graph, plan, estimate(graph, capped, PROFILE), (2, 0), PROFILE) == estimate(graph, plan, PROFILE)
    with pytest.raises(PlanError, match="use estimate"):
        sync = pipeline_plan(graph, Pipeline(2, (1, 1), "sync", 1, (0, 0)))
        restaled(graph, sync, estimate(graph, sync, PROFILE), (0, 0), PROFILE)


def test_stash_counts_the_stage_input() -> None:
    graph = chain_graph()
    no_stash = estimate(graph, pipeline_plan(graph, Pipeline(2, (1, 1), "stale", 1, (0, 0))), PROFILE)
    stash = estimate(graph, pipeline_plan(graph, Pipeline(2, (1, 1), "stale", 1, (0, 2))), PROFILE)
    assert stash.stages[1].memory_bytes - no_stash.stages[1].memory_bytes == 2 * 8 * 8 * 16 * 16 * 4


def test_estimate_command_bad_inputs(capsys: pytest.CaptureFixture[str], tmp_path: Path, repo: Path) -> None:
    from conftest import build_model

    from cost_models.ir.tracing import trace

    shape = (2, 3, 32, 32)
    graph = trace(build_model("unet"), shape)
    plan = Plan(graph.fingerprint, shape, "float32", cluster(2),
                {name: LayerAssignment(Layout(n=2)) for name in graph.compute_layers()}, Pipeline(1, (2,)))
    save_plan(plan, tmp_path / "plan.json")
    base = ["estimate", "--model", f"{repo}/examples/unet.py:unet", "--input-shape", "2,3,32,32",
            "--plan", str(tmp_path / "plan.json"), "--profile", "a100"]
    assert main(base) == 0
    assert "iteration" in capsys.readouterr().out
    for extra, message in ((["--slow-stage", "3:2"], "names stage 3, but the plan has 1 stages"),
                           (["--slow-stage", "x"], "is not K:FACTOR")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    document = json.loads((tmp_path / "plan.json").read_text())
    document["layers"][0]["layout"]["n"] = 4
    (tmp_path / "bad.json").write_text(json.dumps(document))
    assert main(base[:-4] + ["--plan", str(tmp_path / "bad.json"), "--profile", "a100"]) == 2
    assert "does not divide the 2 devices" in capsys.readouterr().err


def test_a_sync_stage_holds_the_activations_of_its_1f1b_micro_batches_in_flight() -> None:
    graph = chain_graph()
    result = estimate(graph, pipeline_plan(graph, Pipeline(2, (1, 1), "sync", 4, (0, 0))), PROFILE)
    for stage, in_flight in ((0, 2), (1, 1)):  # 1F1B: min(M, S − k) micro-batches of stage k
        own = [StepLayer(layer.name, layer.kind, layer.saved_input_of, layer.memory, False)
               for layer in result.layers if layer.stage == stage]
        assert result.stages[stage].memory_bytes == stage_peak_bytes(own, in_flight)
        assert stage_peak_bytes(own, in_flight) > stage_peak_bytes(own, in_flight - 1 or 1) or in_flight == 1


def _memory(*, weights: int = 0, saved_input: int = 0, saved_own: int = 0, transient: int = 0) -> LayerMemory:
    return LayerMemory(weights, weights, weights, saved_input, saved_own, transient)


def test_the_step_peak_counts_a_kept_tensor_once_and_gradients_as_backward_makes_them() -> None:
    conv = _memory(weights=100, saved_input=10, transient=50)  # keeps the model input (a tensor of its own)
    relu = _memory(saved_own=20, transient=30)  # keeps its output ...
    conv2 = _memory(weights=200, saved_input=20, transient=40)  # ... which the next convolution keeps too
    layers = [StepLayer("conv", "conv", "conv", conv, False), StepLayer("relu", "activation", "conv", relu, False),
              StepLayer("conv2", "conv", "relu", conv2, False)]
    assert distinct_saved_bytes(layers) == 10 + 20
    # weights and optimizer state held; backward of conv2: all 30 kept + its transient; of relu: + conv2's
    # gradient (200); of conv: + 200 + its transient 50; after backward: every gradient (300)
    assert stage_peak_bytes(layers) == 2 * 300 + max(30 + 40, 30 + 200 + 30, 10 + 200 + 50, 300)
    bucketed = [replace(layer, bucketed=True) for layer in layers]  # gradients held in buckets from the start
    assert stage_peak_bytes(bucketed) == 3 * 300 + max(30 + 40, 30 + 30, 10 + 50)
    assert stage_peak_bytes(layers, in_flight=2) == 2 * 300 + max(60 + 40, 60 + 200 + 30, 20 + 200 + 50, 300)
