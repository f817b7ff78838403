"""Models taking several tensors (``forward(x, cond)``): tracing, the command line, plan files (single process).

The model is ``examples/conditioned_cnn.py``: an image ``(N, 3, H, W)`` and a
condition ``(N, 8)`` that a linear layer turns into one bias per channel of
the first convolution's feature map.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import REPO, SMALL_SHAPE, build_model

from cost_models.cluster import Cluster, Link
from cost_models.errors import InputError, PlanError
from cost_models.formats.plan import Plan, load_plan, save_plan
from cost_models.ir.graph import LayerGraph, compute_fingerprint, parse_input_shapes
from cost_models.ir.tracing import trace
from cost_models.layout import Layout
from cost_models.uniform import uniform_plan
from examples.conditioned_cnn import conditioned_cnn

SHAPES = ((4, 3, 16, 16), (4, 8))
CLUSTER = Cluster(devices=2, devices_per_node=2, memory_bytes=2**34, intra=Link(1e-6, 1e9), inter=Link(1e-6, 1e9))


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
    older = {key: value for key, value in graph.to_dict().items() if key != "input_shapes"}  # no input_shapes
    assert LayerGraph.from_dict(older).input_shapes == (SMALL_SHAPE,)


@pytest.mark.parametrize(("shapes", "words"), [
    (["4,3,16,16", "2,8"], ["2,8", "batch 2", "4,3,16,16", "batch 4"]),
    (["4,3"], ["N,C,H,W"]),
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


MODEL = "examples/conditioned_cnn.py:conditioned_cnn"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from parplan.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", [
    ["inspect"], ["plan", "--profile", "v100", "--devices", "2", "--out", "unwritten.json"],
    ["estimate", "--plan", "missing.json", "--profile", "v100"], ["run", "--layout", "n2", "--nproc", "2"],
    ["whatif", "--profile", "v100", "--devices", "1,2"], ["check"], ["validate", "--profile", "v100", "--nproc", "2"],
    ["calibrate", "--out", "unwritten.json"],
])
def test_a_batch_mismatch_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], command: list[str],
                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, *command, "--model", f"{REPO}/{MODEL}", "--input-shape", "4,3,16,16",
                             "--input-shape", "2,8")
    assert code == 2 and out == "", (code, out, err)
    assert err.count("\n") == 1 and "2,8" in err and "4,3,16,16" in err and "batch" in err, err
    assert not list(tmp_path.iterdir())


def test_inspect_json_shows_every_input_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "inspect", "--model", f"{REPO}/{MODEL}", "--input-shape", "4,3,16,16",
                             "--input-shape", "4,8", "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["input_shape"] == [4, 3, 16, 16] and document["input_shapes"] == [[4, 3, 16, 16], [4, 8]]
    assert [layer["name"] for layer in document["layers"] if layer["kind"] == "input"] == ["x", "cond"]


def test_plan_file_records_every_input_shape(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "plan.json"
    code, _, err = run_cli(capsys, "plan", "--model", f"{REPO}/{MODEL}", "--input-shape", "4,3,16,16",
                           "--input-shape", "4,8", "--profile", "v100", "--devices", "2", "--max-stages", "1",
                           "--out", str(out_file), "--json")
    assert code == 0, err
    graph = trace(conditioned_cnn(), SHAPES)
    plan = load_plan(out_file, expected_fingerprint=graph.fingerprint)
    assert plan.input_shapes == plan.shapes == SHAPES
    assert json.loads(out_file.read_text())["model"]["input_shapes"] == [[4, 3, 16, 16], [4, 8]]
    with pytest.raises(PlanError, match=r"input 4,3,16,16 and 4,8\)"):
        other = trace(build_model_with_condition(5), ((4, 3, 16, 16), (4, 5)))
        load_plan(out_file, expected_fingerprint=other.fingerprint)


def test_plan_round_trip_with_input_shapes_and_single_input_plans_unchanged(tmp_path: Path) -> None:
    graph = trace(conditioned_cnn(), SHAPES)
    plan = uniform_plan(graph, CLUSTER, [Layout(n=2), Layout()])
    assert plan.input_shapes == SHAPES
    save_plan(plan, tmp_path / "two.json")
    assert load_plan(tmp_path / "two.json", expected_fingerprint=graph.fingerprint) == plan
    single = uniform_plan(trace(build_model("resnet18"), SMALL_SHAPE), CLUSTER, [Layout(n=2), Layout()])
    assert single.input_shapes == () and single.shapes == (SMALL_SHAPE,)
    assert "input_shapes" not in single.to_dict()["model"]
    assert Plan.from_dict(json.loads(json.dumps(single.to_dict()))) == single


@pytest.mark.parametrize(("shapes", "words"), [
    ([[4, 3, 16, 16]], r"input_shapes: \[\[4, 3, 16, 16\]\] is too short"),
    ([[4, 3, 16, 8], [4, 8]], "the first equal to input_shape"),
    ([[4, 3, 16, 16], [2, 8]], "another batch"),
])
def test_inconsistent_input_shapes_in_a_plan_file_are_refused(tmp_path: Path, shapes: list[list[int]],
                                                              words: str) -> None:
    document = uniform_plan(trace(conditioned_cnn(), SHAPES), CLUSTER, [Layout(n=2), Layout()]).to_dict()
    document["model"]["input_shapes"] = shapes
    (tmp_path / "plan.json").write_text(json.dumps(document))
    with pytest.raises(PlanError, match=words):
        load_plan(tmp_path / "plan.json")


def test_an_unsplit_plan_on_one_process_takes_every_input_and_is_the_model_itself() -> None:
    import copy

    from runtime.apply import apply_plan

    model = conditioned_cnn().double()
    graph = trace(model, SHAPES, torch.float64)
    reference = copy.deepcopy(model)
    one = Cluster(devices=1, devices_per_node=1, memory_bytes=2**34, intra=Link(1e-6, 1e9), inter=Link(1e-6, 1e9))
    split = apply_plan(model, uniform_plan(graph, one, [Layout()]), graph=graph)
    generator = torch.Generator().manual_seed(3)
    x, cond = (torch.randn(shape, dtype=torch.float64, generator=generator) for shape in SHAPES)
    assert split.input_boxes() == (tuple(slice(0, e) for e in SHAPES[0]), tuple(slice(0, e) for e in SHAPES[1]))
    assert split.input_box() == split.input_boxes()[0]
    assert torch.equal(split(*split.shard_inputs((x, cond))), reference(x, cond))
    with pytest.raises(PlanError, match=r"takes 2 input\(s\) \(x, cond\).*given 1"):
        split(x)


def test_synthetic_inputs_differ_and_every_box_is_a_box_of_the_whole() -> None:
    from runtime.batches import synthetic_input, synthetic_inputs

    whole = synthetic_inputs(SHAPES, [[slice(None)] * len(shape) for shape in SHAPES], seed=5, dtype=torch.float64)
    assert torch.equal(whole[0], synthetic_input(SHAPES[0], [slice(None)] * 4, seed=5, dtype=torch.float64))
    same_seed = synthetic_input(SHAPES[1], [slice(None)] * 2, seed=5, dtype=torch.float64)
    assert not torch.allclose(whole[1], same_seed)  # not the numbers of the first input's seed
    boxes = ((slice(2, 4), slice(0, 3), slice(0, 8), slice(0, 16)), (slice(2, 4), slice(0, 8)))
    parts = synthetic_inputs(SHAPES, boxes, seed=5, dtype=torch.float64)
    assert all(torch.equal(part, full[box]) for part, full, box in zip(parts, whole, boxes))


class _OptionalCondition(torch.nn.Module):
    """``forward(x, t=None)``: the condition is used only when given (a diffusion UNet's timestep)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.lin = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, t: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        h = self.conv(x) * scale
        if t is not None:
            h = h + self.lin(t)[:, :, None, None]
        return h


def test_an_optional_argument_is_an_input_when_given_a_shape_and_its_default_otherwise() -> None:
    from runtime.preflight import check_runnable

    model = _OptionalCondition()
    alone, both = trace(model, SHAPES[0]), trace(model, SHAPES)
    assert alone.inputs() == ["x"] and "lin" not in alone.nodes
    assert both.inputs() == ["x", "t"] and list(both.predecessors("lin")) == ["t"]
    for graph in (alone, both):  # the runtime's own trace has the same layers as the plan's
        check_runnable(model, uniform_plan(graph, CLUSTER, [Layout(n=2), Layout()]), graph)


def test_run_refuses_a_plan_of_other_input_shapes_before_any_rank_starts(capsys: pytest.CaptureFixture[str],
                                                                        tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    save_plan(uniform_plan(trace(conditioned_cnn(), SHAPES), CLUSTER, [Layout(n=2), Layout()]), plan)
    code, out, err = run_cli(capsys, "run", "--model", f"{REPO}/{MODEL}", "--input-shape", "4,3,16,8",
                             "--input-shape", "4,8", "--plan", str(plan), "--steps", "1")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "at input [4, 3, 16, 8] and [4, 8]" in err and "make a new plan" in err, err


@pytest.mark.parametrize("data", ["", "examples.pattern_data:conditioned_batch"])
def test_one_rank_trains_and_verifies_two_inputs(data: str, tmp_path: Path) -> None:
    """``parplan run``'s worker in this process (a gloo group of one): synthetic data per input, or a factory
    given a tuple of boxes; ``--verify`` runs the unsplit model on both whole inputs."""
    import torch.distributed as dist

    from runtime.options import RunOptions
    from runtime.train import worker

    graph = trace(conditioned_cnn(), SHAPES, "float64")
    one = Cluster(devices=1, devices_per_node=1, memory_bytes=2**34, intra=Link(1e-6, 1e9), inter=Link(1e-6, 1e9))
    options = RunOptions(model=f"{REPO}/{MODEL}", input_shape=SHAPES[0], input_shapes=SHAPES,  # type: ignore[arg-type]
                         dtype="float64", plan=uniform_plan(graph, one, [Layout()]).to_dict(), steps=2, warmup=0,
                         verify=True, tolerance=1e-9, graph=graph, quiet=True, data=data)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        document = worker(options)
    finally:
        dist.destroy_process_group()
    assert document is not None and document["model"]["input_shapes"] == [list(shape) for shape in SHAPES]
    assert document["verify"]["passed"] and len(document["loss"]) == 2
