"""Timelines: the predicted one (``cost_models.formats.timeline``) spans exactly the estimate's iteration under every
schedule, and ``parplan estimate --trace`` / ``parplan run --trace`` write Chrome traces naming the plan's layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torchvision

from calibrate.presets import preset_profile
from cost_models.estimate import estimate
from cost_models.formats.plan import load_plan
from cost_models.formats.timeline import LAYER_EVENT, predicted_trace
from cost_models.ir.tracing import trace
from cost_models.layout import Layout
from cost_models.uniform import balanced_starts, staged, uniform_plan
from parplan.api import cluster
from parplan.cli import main

PROFILE = preset_profile("h100")


@pytest.fixture(scope="module")
def resnet18():  # noqa: ANN201 - a LayerGraph
    return trace(torchvision.models.resnet18(), (8, 3, 64, 64))


def _span_s(document: dict) -> float:
    events = [event for event in document["traceEvents"] if event["ph"] == "X"]
    return (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)) / 1e6


def _named(document: dict) -> set[str]:
    return {e["name"][len(LAYER_EVENT):] for e in document["traceEvents"] if e["name"].startswith(LAYER_EVENT)}


def _plans(graph):  # noqa: ANN001, ANN202
    eight = cluster("h100", 8)
    yield uniform_plan(graph, cluster("h100", 2), [Layout(n=2), Layout()])
    yield uniform_plan(graph, eight, [Layout(n=2, w=2, h=2), Layout(n=2), Layout()])
    for stages, schedule, micro in ((2, "sync", 2), (4, "sync", 4), (2, "stale", 1), (4, "stale", 1)):
        whole = uniform_plan(graph, eight, [Layout(n=max(1, 8 // stages // micro)), Layout()])
        yield staged(whole, graph, balanced_starts(graph, stages), schedule, micro)


@pytest.mark.parametrize("options", [{}, {"overlap": False}, {"slowdown": {1: 2.5}}, {"shared_cores": 1.5}],
                         ids=["overlap", "serial", "straggler", "shared cores"])
def test_the_predicted_timeline_spans_the_estimated_iteration(resnet18, options: dict) -> None:  # noqa: ANN001
    for plan in _plans(resnet18):
        slowdown = {k: v for k, v in options.get("slowdown", {}).items() if k < plan.pipeline.stages}
        result = estimate(resnet18, plan, PROFILE, **{**options, "slowdown": slowdown})
        document = predicted_trace(plan, result)
        assert _span_s(document) == pytest.approx(result.iteration_s, rel=1e-9), plan.summary()
        timed = {layer.name for layer in result.layers if layer.cost.forward_s + layer.cost.backward_s > 0}
        assert timed <= _named(document), plan.summary()


def test_a_layers_terms_nest_inside_its_event(resnet18) -> None:  # noqa: ANN001
    plan = uniform_plan(resnet18, cluster("h100", 4), [Layout(n=2, h=2), Layout()])
    events = [e for e in predicted_trace(plan, estimate(resnet18, plan, PROFILE))["traceEvents"] if e["ph"] == "X"]
    layers = [e for e in events if e["name"].startswith(LAYER_EVENT)]
    terms = [e for e in events if e["cat"] == "term"]
    assert {e["name"] for e in terms} >= {"forward", "backward data", "backward weight", "halo exchange (exposed)"}
    for term in terms:
        assert any(p["pid"] == term["pid"] and p["ts"] - 1e-6 <= term["ts"]
                   and term["ts"] + term["dur"] <= p["ts"] + p["dur"] + 1e-6 for p in layers), term


def test_estimate_and_run_write_traces_naming_the_plans_layers(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = ["--model", "torchvision:resnet18", "--input-shape", "4,3,64,64"]
    plan_path, predicted, measured = tmp_path / "plan.json", tmp_path / "predicted.json", tmp_path / "measured.json"
    assert main(["plan", *model, "--profile", "h100", "--devices", "2", "--max-stages", "1",
                 "--out", str(plan_path)]) == 0
    capsys.readouterr()
    assert main(["estimate", *model, "--profile", "h100", "--plan", str(plan_path), "--trace", str(predicted),
                 "--json"]) == 0
    estimated = json.loads(capsys.readouterr().out)
    assert main(["run", *model, "--plan", str(plan_path), "--steps", "1", "--warmup", "0", "--trace", str(measured),
                 "--json"]) == 0
    plan = load_plan(plan_path)
    assert _span_s(json.loads(predicted.read_text())) == pytest.approx(estimated["iteration_s"], rel=0.01)
    for path, kind in ((predicted, "predicted"), (measured, "measured")):
        document = json.loads(path.read_text())
        assert document["otherData"]["kind"] == kind
        assert len(_named(document) & set(plan.layers)) >= 0.9 * len(plan.layers), path.name
