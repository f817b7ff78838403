"""``parplan validate``: accuracy figures, k best distinct plans, corrections and their fit, and the command end to end.

Tier 1 on hand-made numbers and tables; tier 2 on the traced UNet with the
h100 preset; one multi-rank run of the whole command on a tiny configuration
(its numbers are not asserted: they are this machine's).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from calibrate.presets import preset_cluster, preset_profile
from calibrate.refine import Observation, fit_corrections, held_out_predictions, local_s
from cost_models.corrections import Corrections, layer_key, split_class
from cost_models.estimate import estimate
from cost_models.layout import Layout
from cost_models.profile import Profile, load_profile, save_profile
from parplan.cli import main
from planner.candidates import validation_candidates
from planner.settings import SearchSettings
from planner.solvers.cost_table import CostTable
from planner.solvers.ilp import solve_ilp
from planner.validate import accuracy, percentile, relative_errors, unseen_accuracy
from processes.cores import shared_cores

UNET = ["--model", "examples/unet.py:unet", "--input-shape", "4,3,40,24"]


def test_accuracy_of_a_perfect_and_of_a_reversed_prediction() -> None:
    perfect = accuracy([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert (perfect.median_rel_err, perfect.p90_rel_err, perfect.kendall_tau, perfect.regret) == (0.0, 0.0, 1.0, 0.0)
    reversed_ = accuracy([3.0, 2.0, 1.0], [1.0, 2.0, 3.0], first=2)
    assert reversed_.kendall_tau == pytest.approx(-1.0)
    assert reversed_.regret == pytest.approx(2.0)  # the planner's choice measured 3 s, the best 1 s
    assert reversed_.median_rel_err == pytest.approx(2 / 3)  # errors 2, 0, 2/3
    assert reversed_.p90_rel_err == pytest.approx(2 / 3 + 0.8 * (2 - 2 / 3))


def test_relative_errors_are_signed_and_refuse_bad_input() -> None:
    assert relative_errors([0.9, 1.2], [1.0, 1.0]) == pytest.approx([-0.1, 0.2])
    with pytest.raises(ValueError, match="2 predictions for 1"):
        relative_errors([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        relative_errors([1.0], [0.0])
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5 and percentile([7.0], 0.9) == 7.0


def test_unseen_accuracy_leaves_out_the_calibration_runs() -> None:
    predicted, measured = [1.0, 2.0, 3.0, 4.0], [1.0, 2.9, 2.8, 4.4]
    figures = unseen_accuracy([True, False, False, True], predicted, measured)
    assert figures is not None and figures.n == 2
    assert figures.median_rel_err == pytest.approx((0.9 / 2.9 + 0.2 / 2.8) / 2)
    assert figures.regret == pytest.approx(2.9 / 2.8 - 1) and figures.kendall_tau == pytest.approx(-1.0)
    assert unseen_accuracy([True] * 4, predicted, measured) is None


def test_ranks_share_cores_when_they_fill_them() -> None:
    assert shared_cores(4, 1, 2) == 2.0 and shared_cores(3, 2, 4) == 2.0
    assert shared_cores(2, 1, 2) == 2.0 and shared_cores(1, 1, 16) is None and shared_cores(2, 1, 4) is None
    with pytest.raises(ValueError, match="positive"):
        shared_cores(2, 0, 2)


def _table() -> CostTable:
    layers = ("a", "b", "c")
    options = {layer: ("x", "y", "z") for layer in layers}
    node = {"a": (1.0, 2.0, 4.0), "b": (3.0, 1.0, 2.5), "c": (2.0, 2.0, 1.0)}
    edge = {("a", "b"): ((0.0, 1.5, 0.7), (1.0, 0.0, 2.0), (0.3, 0.2, 0.0)),
            ("a", "c"): ((0.0, 0.4, 1.1), (0.5, 0.0, 0.6), (1.2, 0.9, 0.0))}
    return CostTable(layers, options, node, edge)


def test_excluding_each_optimum_lists_the_k_best_plans_in_order() -> None:
    table = _table()
    every = sorted(table.objective(dict(zip(table.layers, c))) for c in itertools.product(range(3), repeat=3))
    found, excluded = [], []
    for _ in range(5):
        solution = solve_ilp(table, exclude=excluded)
        excluded.append(solution.choice)
        found.append(solution.objective_s)
    assert found == pytest.approx(every[:5])
    assert len({tuple(c.values()) for c in excluded}) == 5


def test_a_minimum_difference_keeps_the_next_plan_that_far_from_every_earlier_one() -> None:
    table = _table()
    first = solve_ilp(table)
    second = solve_ilp(table, exclude=[first.choice], min_difference=2)
    assert sum(first.choice[l] != second.choice[l] for l in table.layers) >= 2
    candidates = [dict(zip(table.layers, c)) for c in itertools.product(range(3), repeat=3)]
    far = [c for c in candidates if sum(c[l] != first.choice[l] for l in table.layers) >= 2]
    assert second.objective_s == pytest.approx(min(table.objective(c) for c in far))


def test_corrections_fall_back_from_the_key_to_its_split_to_everything() -> None:
    corrections = Corrections({"conv·spatial": 2.0, "*·spatial": 1.5, "*": 1.2})
    assert corrections.scale("conv", Layout(h=2)) == 2.0
    assert corrections.scale("batchnorm", Layout(n=2, w=2)) == 1.5
    assert corrections.scale("conv", Layout(n=2)) == 1.2 and corrections.scale("conv", Layout(c=2)) == 1.2
    assert Corrections().scale("conv", Layout(h=2)) == 1.0
    assert split_class(Layout(n=2)) == "" and layer_key("conv", Layout(c=2, h=2)) == "conv·channel·spatial"


def test_a_profile_keeps_its_corrections_through_json(tmp_path: Path) -> None:
    profile = replace(preset_profile("h100"), corrections=Corrections({"conv": 1.5}, 0.002, 0.0005, 0.25, {"runs": ["a"]}))
    save_profile(profile, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json").corrections == profile.corrections
    document = json.loads((tmp_path / "p.json").read_text())
    document["corrections"]["step_overhead_s"] = -1.0
    (tmp_path / "bad.json").write_text(json.dumps(document))
    with pytest.raises(Exception, match="step_overhead_s|minimum"):
        load_profile(tmp_path / "bad.json")


@pytest.fixture(scope="module")
def unet_candidates() -> tuple[object, Profile, list]:
    from cost_models.ir.model_spec import load_model
    from cost_models.ir.tracing import trace

    graph = trace(load_model("examples/unet.py:unet"), (4, 3, 40, 24))
    profile = preset_profile("h100")
    found, _ = validation_candidates(graph, profile, preset_cluster("h100", 4), 4, SearchSettings(),
                                     model_spec="examples/unet.py:unet")
    return graph, profile, found


def test_candidates_put_the_planners_choice_first_and_add_the_baselines(unet_candidates: tuple) -> None:
    graph, profile, found = unet_candidates
    top = [c for c in found if c.role == "top"]
    assert top[0].name.startswith("top 1") and 2 <= len(top) <= 4
    times = [c.estimate.iteration_s for c in top]
    assert times[1:] == sorted(times[1:])  # the planner's choice first, then the others fastest first
    assert all(abs(a - b) >= 0.03 * min(a, b) for a, b in itertools.combinations(times, 2))
    names = " ".join(c.name for c in found)
    assert "pure sample" in names and "pure spatial" in names
    keys = [tuple(sorted((n, str(a.layout), a.stage) for n, a in c.plan.layers.items())) + (c.plan.pipeline,)
            for c in found]
    assert len(set(keys)) == len(keys)


def _measured_under(truth: Corrections, graph: Any, profile: Any, found: Any) -> list[Observation]:
    """What runs of ``found`` would measure were ``truth`` the machine's corrections: each plan's estimate under it."""
    runs = []
    for candidate in found:
        measured = estimate(graph, candidate.plan, replace(profile, corrections=truth))
        layers = {layer.name: local_s(layer, candidate.plan, redistribution=True) for layer in measured.layers}
        runs.append(Observation(candidate.name, candidate.plan, measured.iteration_s, layers))
    return runs


def test_refining_recovers_corrections_that_made_the_measurements(unet_candidates: tuple) -> None:
    graph, profile, found = unet_candidates
    truth = Corrections({"conv": 1.8, "conv·spatial": 3.0, "batchnorm·spatial": 2.5, "*": 1.3}, 0.004, 0.0, 0.5)
    runs = _measured_under(truth, graph, profile, found)
    fitted = fit_corrections(graph, profile, runs)
    for run in runs:
        refined = estimate(graph, run.plan, replace(profile, corrections=fitted)).iteration_s
        assert refined == pytest.approx(run.measured_s, rel=0.05)  # factors are shrunk towards their parents
    assert fitted.step_overhead_s == pytest.approx(0.004, rel=0.25)  # shrinkage biases the factors a little
    held_out = held_out_predictions(graph, profile, runs)
    before = accuracy([c.estimate.iteration_s for c in found], [r.measured_s for r in runs])
    after = accuracy(held_out, [r.measured_s for r in runs])
    assert after.median_rel_err < before.median_rel_err


def test_split_layers_only_keeps_split_factors_and_fits_pipeline_events(unet_candidates: tuple) -> None:
    """Calibration's split forms: factors of split layers only, no per-step seconds, the per-event seconds of a
    pipeline found given those factors."""
    graph, profile, found = unet_candidates
    truth = Corrections({"conv·spatial": 3.0, "batchnorm·spatial": 2.5, "*·spatial": 2.0}, 0.0, 0.002, 0.0)
    runs = _measured_under(truth, graph, profile, found)
    assert any(run.plan.pipeline.stages > 1 for run in runs) and any(
        layer.layout.spatial > 1 for run in runs for layer in estimate(graph, run.plan, profile).layers)
    fitted = fit_corrections(graph, profile, runs, split_layers_only=True)
    assert fitted.layer_scale and all("·" in key for key in fitted.layer_scale)
    assert fitted.step_overhead_s == 0.0 and fitted.event_overhead_s == pytest.approx(0.002, rel=0.1)
    for run in runs:
        refined = estimate(graph, run.plan, replace(profile, corrections=fitted)).iteration_s
        assert refined == pytest.approx(run.measured_s, rel=0.05)


def test_split_factors_are_anchored_to_the_whole_steps(unet_candidates: tuple) -> None:
    """Per-layer times under the profiler read split layers slower than the steps run them (the profiler's cost,
    the neighbours' waits seen twice): calibration's fit keeps their proportions and meets the steps."""
    graph, profile, found = unet_candidates
    truth = Corrections({"conv·spatial": 2.0, "batchnorm·spatial": 3.0, "*·spatial": 2.0, "*·channel": 1.5},
                        0.0, 0.002, 0.0)
    exact, runs = _measured_under(truth, graph, profile, found), []
    for run in exact:
        assert run.layers_s is not None
        split = {layer.name for layer in estimate(graph, run.plan, profile).layers if layer.layout.spatial > 1}
        inflated = {name: seconds * (1.6 if name in split else 1.0) for name, seconds in run.layers_s.items()}
        runs.append(replace(run, layers_s=inflated))
    fitted = fit_corrections(graph, profile, runs, split_layers_only=True)
    assert fitted.fitted_on["split_scales"]["spatial"] == pytest.approx(1 / 1.6, rel=0.1)  # shrinkage mixes
    unbiased = fit_corrections(graph, profile, exact, split_layers_only=True)
    for key, factor in unbiased.layer_scale.items():  # the same factors as from per-layer times read right
        assert fitted.layer_scale[key] == pytest.approx(factor, rel=0.05), key
    for run in runs:
        refined = estimate(graph, run.plan, replace(profile, corrections=fitted)).iteration_s
        assert refined == pytest.approx(run.measured_s, rel=0.05)


def _parplan(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(Path(sys.executable).parent / "parplan"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.multirank
def test_validate_runs_plans_and_writes_a_refined_profile(repo: Path, tmp_path: Path) -> None:
    refined, out = tmp_path / "refined.json", tmp_path / "report.json"
    run = _parplan("validate", *UNET, "--profile", "h100", "--nproc", "2", "--plans", "2", "--steps", "2",
                   "--warmup", "0", "--refine", str(refined), "--out", str(out), "--json", "--layouts", "w2", cwd=repo)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report == json.loads(out.read_text()) and report["format"] == "parplan.validation/1"
    assert len(report["plans"]) >= 3 and report["plans"][0]["name"].startswith("top 1")
    assert report["plans"][-1]["name"] == "layout w2"  # --layouts: parplan run --layout's plan, run and priced
    assert all(p["measured_s"] > 0 and p["predicted_s"] > 0 for p in report["plans"])
    for field in ("median_rel_err", "p90_rel_err", "kendall_tau", "regret"):
        assert field in report and field in report["refine"]["after"]
    assert report["per_layer"] and all(row["measured_s"] > 0 for row in report["per_layer"])
    assert load_profile(refined).corrections is not None
    assert len(report["refine"]["held_out_predicted_s"]) == len(report["plans"])


def test_bad_validate_arguments_are_one_line_and_exit_two(capsys: pytest.CaptureFixture[str], repo: Path,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo)
    assert main(["validate", *UNET, "--profile", "h100", "--nproc", "2", "--refine", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert main(["validate", *UNET, "--profile", str(tmp_path / "none.json"), "--nproc", "2"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["validate", *UNET, "--profile", "h100", "--nproc", "2", "--layouts", "n4"]) == 2
    assert "not the 2 ranks of --nproc" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["validate", *UNET, "--profile", "h100", "--nproc", "2", "--plans", "0"])
    assert exited.value.code == 2


def test_layer_seconds_attribute_each_backward_to_the_layer_whose_forward_made_it() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from runtime.layer_times import LAYER_RANGE, layer_seconds

    conv, branch = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 1)
    x = torch.randn(2, 3, 16, 16)
    with profile(activities=[ProfilerActivity.CPU]) as recorded:
        with record_function(f"{LAYER_RANGE}conv"):
            y = conv(x)
        with record_function(f"{LAYER_RANGE}branch"):
            z = branch(y)
        with record_function(f"{LAYER_RANGE}add"):
            out = y + z  # a residual: y's gradient comes from two layers
        out.sum().backward()
    seconds = layer_seconds(recorded.events())
    assert set(seconds) == {"conv", "branch", "add"}
    assert all(forward > 0 and backward > 0 for forward, backward in seconds.values())
    names = {e.name for e in recorded.events()}
    assert any("ConvolutionBackward" in name for name in names)


def test_ranks_sharing_cores_stretch_the_iteration_by_their_work_over_the_cores(unet_candidates: tuple) -> None:
    graph, profile, found = unet_candidates
    one_stage = next(c for c in found if c.plan.pipeline.stages == 1)
    alone = estimate(graph, one_stage.plan, profile)
    shared = estimate(graph, one_stage.plan, profile, shared_cores=2.0)
    stage = alone.stages[0]
    work_s = 4 * (stage.forward_s + stage.backward_s + stage.allreduce_s)  # 4 ranks' compute and allreduce
    assert alone.contention == 1.0 and estimate(graph, one_stage.plan, profile, shared_cores=8.0).contention == 1.0
    assert shared.iteration_s == pytest.approx(max(alone.iteration_s, work_s / 2.0))
    assert shared.contention == pytest.approx(shared.iteration_s / alone.iteration_s)
