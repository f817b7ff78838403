"""Pipeline stage search (tier 1 on hand-made numbers, tier 2 on resnet18) and the runner-up explanation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.presets import preset_cluster, preset_profile
from conftest import build_model
from cost_models.graph import trace
from cost_models.plan import load_plan
from planner.cli import main
from planner.cost_table import CostTable
from planner.explain import runner_ups
from planner.search import plan_model
from planner.stages import balanced_cuts, micro_batches, stage_counts


def test_balanced_cuts_minimise_the_largest_stage() -> None:
    assert balanced_cuts([1, 1, 1, 1], 2) == [0, 2]
    assert balanced_cuts([5, 1, 1, 1, 1, 1], 2) == [0, 1]
    assert balanced_cuts([1, 2, 3, 4, 5], 3) == [0, 3, 4]  # 6 | 4 | 5
    with pytest.raises(Exception, match="at most 2 stages"):
        balanced_cuts([1, 1], 3)


def test_stage_counts_and_micro_batches() -> None:
    assert stage_counts(64, 8, 4) == [2, 4]  # 32 and 16 devices: whole nodes
    assert stage_counts(8, 8, 4) == [2, 4]  # parts of one node
    assert stage_counts(24, 8, 4) == [3]  # 12 devices per stage would split a node unevenly
    assert micro_batches(64, 2) == 8 and micro_batches(6, 4) == 6 and micro_batches(7, 2) == 7


def test_runner_ups_name_the_best_alternative_and_its_extra_cost() -> None:
    table = CostTable(("a", "b"), {"a": ("x", "y", "z"), "b": ("x", "y")}, {"a": (1.0, 1.5, 3.0), "b": (1.0, 0.2)},
                      {("a", "b"): ((0.0, 2.0), (2.0, 0.0), (1.0, 1.0))})
    found = runner_ups(table, {"a": 0, "b": 0})
    assert found["a"].option == "y" and found["a"].extra_s == pytest.approx(2.5)  # 1.5 + 2 (shuffle) − 1
    assert found["b"].option == "y" and found["b"].extra_s == pytest.approx(1.2)  # 0.2 + 2 − 1


@pytest.fixture(scope="module")
def resnet18():  # noqa: ANN201
    return trace(build_model("resnet18"), (8, 3, 64, 64))


def test_the_search_prices_sync_and_stale_pipelines(resnet18) -> None:  # noqa: ANN001
    profile, cluster = preset_profile("h100"), preset_cluster("h100", 8)
    result = plan_model(resnet18, profile, cluster, max_stages=4)
    summaries = [c.summary for c in result.considered]
    assert any("2 stages sync" in s for s in summaries) and any("4 stages stale≤6" in s for s in summaries)
    assert result.estimate.iteration_s <= min(c.iteration_s for c in result.considered if c.fits) + 1e-12
    assert all(result.estimate.iteration_s <= b.estimate.iteration_s + 1e-12 for b in result.baselines)
    assert result.chosen_from == "search" and result.runner_ups  # explained, pipeline or not
    assert all(found.option is None or found.extra_s >= -1e-12 for found in result.runner_ups.values())
    plan = result.plan
    order = resnet18.compute_layers()
    stages = [plan.layers[name].stage for name in order]
    assert stages == sorted(stages)  # contiguous cuts in topological order
    if plan.pipeline.schedule == "stale":
        assert plan.pipeline.staleness == tuple(2 * (plan.pipeline.stages - 1 - k) for k in range(plan.pipeline.stages))


def test_max_staleness_bounds_and_zero_means_synchronous(resnet18) -> None:  # noqa: ANN001
    profile, cluster = preset_profile("h100"), preset_cluster("h100", 8)
    bounded = plan_model(resnet18, profile, cluster, max_stages=4, schedule="stale", max_staleness=2)
    assert all("stale≤2" in c.summary for c in bounded.considered if "stages" in c.summary)
    synchronous = plan_model(resnet18, profile, cluster, max_stages=4, max_staleness=0)
    assert not any("stale" in c.summary for c in synchronous.considered)
    assert not any(synchronous.plan.pipeline.staleness)


def test_plan_command_explains_and_records_the_pipeline(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    args = ["plan", "--model", "torchvision:resnet18", "--input-shape", "8,3,64,64", "--profile", "h100",
            "--devices", "8", "--out", str(out)]
    assert main([*args, "--explain"]) == 0
    text = capsys.readouterr().out
    assert "runner-up" in text and "pure sample" in text and "speedup" in text
    assert main([*args, "--json", "--max-stages", "2", "--schedule", "sync"]) == 0
    document = json.loads(capsys.readouterr().out)
    plan = load_plan(out)
    assert plan.pipeline.schedule == "sync" and document["pipeline"]["staleness"] == [0] * plan.pipeline.stages
    assert {row["layer"] for row in document["decisions"]} >= {"conv1", "fc"}
    with pytest.raises(SystemExit) as exited:
        main([*args, "--max-staleness", "-1"])
    assert exited.value.code == 2 and "--max-staleness" in capsys.readouterr().err
