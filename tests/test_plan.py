"""Tier 1: plan files — round trip, schema, versions, fingerprints, atomic writes (no torch)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cost_models.cluster import Cluster, Link
from cost_models.errors import InputError, PlanError
from cost_models.formats.plan import (
    LayerAssignment,
    Pipeline,
    Plan,
    Prediction,
    SolverInfo,
    check_plan_for_graph,
    load_plan,
    save_plan,
)
from cost_models.ir.graph import LayerGraph
from cost_models.layout import Layout

FINGERPRINT = "sha256:0123456789abcdef01234567"
CLUSTER = Cluster(devices=8, devices_per_node=4, memory_bytes=16 * 2**30,
                  intra=Link(2e-6, 150e9), inter=Link(5e-6, 25e9), name="test")


def make_plan(**overrides: object) -> Plan:
    fields: dict[str, object] = {
        "fingerprint": FINGERPRINT,
        "input_shape": (8, 3, 64, 64),
        "dtype": "float32",
        "cluster": CLUSTER,
        "layers": {"conv1": LayerAssignment(Layout(n=4, h=2)), "fc": LayerAssignment(Layout(n=8))},
        "pipeline": Pipeline(stages=1, devices_per_stage=(8,)),
        "predicted": Prediction(0.125, 3 * 2**30, {"compute": 0.1, "halo": 0.025}),
        "solver": SolverInfo("cbc", "Optimal", 0.42, objective=0.125, gap=0.0),
        "model_spec": "torchvision:resnet18",
    }
    fields.update(overrides)
    return Plan(**fields)  # type: ignore[arg-type]


def tiny_graph() -> LayerGraph:
    graph = LayerGraph(input_shape=[8, 3, 64, 64], dtype="float32", outputs=["fc"], fingerprint=FINGERPRINT)
    graph.add_node("x", kind="input", output_shape=[8, 3, 64, 64])
    graph.add_node("conv1", kind="conv", output_shape=[8, 16, 64, 64])
    graph.add_node("fc", kind="linear", output_shape=[8, 10])
    graph.add_edges_from([("x", "conv1"), ("conv1", "fc")])
    return graph


def write(path: Path, document: object) -> Path:
    path.write_text(json.dumps(document))
    return path


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    plan = make_plan(created="2026-11-30T00:00:00+00:00")
    save_plan(plan, tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json", expected_fingerprint=FINGERPRINT) == plan
    document = json.loads((tmp_path / "plan.json").read_text())
    assert document["format"] == "parplan.plan/3" and document["pipeline"]["recompute"] == [False]
    assert document["layers"][0] == {"name": "conv1", "layout": {"n": 4, "c": 1, "d": 1, "h": 2, "w": 1}, "stage": 0}


def test_a_version_1_plan_reads_with_unsplit_depth(tmp_path: Path) -> None:
    document = make_plan().to_dict() | {"format": "parplan.plan/1"}
    del document["pipeline"]["recompute"]
    for layer in document["layers"]:
        del layer["layout"]["d"]
    assert load_plan(write(tmp_path / "p.json", document)) == make_plan(created=document["created"])
    document["layers"][0]["layout"]["d"] = 1  # a /1 document has no depth
    with pytest.raises(PlanError, match="not a valid parplan.plan/1 document"):
        load_plan(write(tmp_path / "p.json", document))


def test_a_version_3_plan_without_depth_is_refused(tmp_path: Path) -> None:
    document = make_plan().to_dict()
    del document["layers"][0]["layout"]["d"]
    with pytest.raises(PlanError, match=r"not a valid parplan.plan/3 document: at \$.layers\[0\].layout"):
        load_plan(write(tmp_path / "p.json", document))


def test_a_version_2_plan_reads_with_no_stage_recomputing(tmp_path: Path) -> None:
    document = make_plan().to_dict() | {"format": "parplan.plan/2"}
    del document["pipeline"]["recompute"]
    loaded = load_plan(write(tmp_path / "p.json", document))
    assert loaded == make_plan(created=document["created"]) and not loaded.pipeline.recomputes(0)
    document["pipeline"]["recompute"] = [True]  # a /2 document cannot say it
    with pytest.raises(PlanError, match="not a valid parplan.plan/2 document"):
        load_plan(write(tmp_path / "p.json", document))


def test_recomputing_stages_round_trip(tmp_path: Path) -> None:
    from dataclasses import replace

    plan = make_plan(created="2026-12-04T00:00:00+00:00")
    again = replace(plan, pipeline=replace(plan.pipeline, recompute=(True,)))
    save_plan(again, tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json") == again and str(again.pipeline) == "1 stage, recompute"
    with pytest.raises(PlanError, match="recompute flags"):
        replace(plan, pipeline=replace(plan.pipeline, recompute=(True, False)))


def test_summary_is_one_line() -> None:
    assert make_plan().summary() == "n4·h2 (1), n8 (1); 1 stage"
    stale = Pipeline(stages=2, devices_per_stage=(4, 4), schedule="stale", staleness=(2, 0))
    assert str(stale) == "2 stages stale≤2"


def test_fingerprint_mismatch_names_both(tmp_path: Path) -> None:
    save_plan(make_plan(), tmp_path / "plan.json")
    with pytest.raises(PlanError) as info:
        load_plan(tmp_path / "plan.json", expected_fingerprint="sha256:ffffffffffffffffffffffff")
    assert FINGERPRINT in str(info.value) and "sha256:ffffffffffffffffffffffff" in str(info.value)


def test_unknown_version_is_refused_naming_both(tmp_path: Path) -> None:
    document = make_plan().to_dict() | {"format": "parplan.plan/4"}
    with pytest.raises(PlanError, match=r"'parplan.plan/4' but this parplan reads 'parplan.plan/3'"):
        load_plan(write(tmp_path / "p.json", document))


def test_other_documents_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="not a parplan.plan document"):
        load_plan(write(tmp_path / "p.json", {"format": "parplan.profile/1"}))
    with pytest.raises(PlanError, match="holds a JSON list"):
        load_plan(write(tmp_path / "p.json", [1, 2]))


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda d: d.pop("cluster"), "'cluster' is a required property"),
        (lambda d: d["layers"][0]["layout"].update(n=0), r"\$.layers\[0\].layout.n"),
        (lambda d: d["layers"][0].update(stage="0"), r"\$.layers\[0\].stage"),
        (lambda d: d["cluster"].update(devices=-8), r"\$.cluster.devices"),
        (lambda d: d["model"].update(input_shape=[8, 3]), r"\$.model.input_shape"),
        (lambda d: d["model"].update(fingerprint="md5:12"), r"\$.model.fingerprint"),
        (lambda d: d["pipeline"].update(schedule="async"), r"\$.pipeline.schedule"),
        (lambda d: d.update(extra=1), "'extra' was unexpected"),
    ],
)
def test_schema_violations_are_refused_with_their_path(tmp_path: Path, mutate, where: str) -> None:
    document = make_plan().to_dict()
    mutate(document)
    with pytest.raises(PlanError, match=where):
        load_plan(write(tmp_path / "p.json", document))


def test_truncated_and_missing_files(tmp_path: Path) -> None:
    save_plan(make_plan(), tmp_path / "plan.json")
    text = (tmp_path / "plan.json").read_text()
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    with pytest.raises(InputError, match=r"not valid JSON .* line \d+, column \d+"):
        load_plan(tmp_path / "cut.json")
    with pytest.raises(InputError, match="does not exist"):
        load_plan(tmp_path / "absent.json")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"pipeline": Pipeline(stages=2, devices_per_stage=(8,), staleness=(0, 0))}, "2 stages but 1 device counts"),
        ({"pipeline": Pipeline(stages=1, devices_per_stage=(16,))}, "use 16 devices but the cluster has 8"),
        ({"pipeline": Pipeline(stages=1, devices_per_stage=(8,), staleness=(2,))}, "'sync' pipeline has no staleness"),
        ({"layers": {"conv1": LayerAssignment(Layout(n=3))}}, "does not divide the 8 devices"),
        ({"layers": {"conv1": LayerAssignment(Layout(n=2), stage=1)}}, "on stage 1, but the pipeline has 1"),
    ],
)
def test_inconsistent_plans_are_refused(overrides: dict, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        make_plan(**overrides)


def test_inconsistency_in_a_file_names_the_file(tmp_path: Path) -> None:
    document = make_plan().to_dict()
    document["layers"][1]["layout"]["n"] = 3
    with pytest.raises(PlanError, match=r"p.json: layer 'fc' has layout n3"):
        load_plan(write(tmp_path / "p.json", document))
    document["layers"][1] = dict(document["layers"][0])
    with pytest.raises(PlanError, match="more than once"):
        load_plan(write(tmp_path / "p.json", document))


def test_check_against_the_graph() -> None:
    check_plan_for_graph(make_plan(), tiny_graph())
    with pytest.raises(PlanError, match="no layout for 1 layers"):
        check_plan_for_graph(make_plan(layers={"conv1": LayerAssignment(Layout(n=8))}), tiny_graph())
    extra = {"conv1": LayerAssignment(Layout(n=8)), "fc": LayerAssignment(Layout(n=8)), "ghost": LayerAssignment(Layout())}
    with pytest.raises(PlanError, match="does not have"):
        check_plan_for_graph(make_plan(layers=extra), tiny_graph())
    too_fine = {"conv1": LayerAssignment(Layout(n=8)), "fc": LayerAssignment(Layout(n=8))}
    graph = tiny_graph()
    graph.replace_layer("conv1", output_shape=[4, 16, 64, 64])  # a layer is a frozen value
    with pytest.raises(PlanError, match="empty parts"):
        check_plan_for_graph(make_plan(layers=too_fine), graph)


def test_save_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "plan.json"
    save_plan(make_plan(), target)
    before = target.read_text()

    def crash(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        save_plan(make_plan(dtype="bfloat16"), target)
    assert target.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_save_into_a_missing_directory_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        save_plan(make_plan(), tmp_path / "nowhere" / "plan.json")
