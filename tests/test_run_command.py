"""``parplan run``: a planner's plan executed on 2 local ranks, the same under ``mpirun -n 4``, and bad input.

The launched runs are real: ranks started by torchrun's machinery or by
Open MPI, training on synthetic data, with ``--verify`` comparing the first
step with the unsplit model (the measurement's ``verify`` block).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from parplan.cli import main

UNET = ["--model", "examples/unet.py:unet", "--input-shape", "4,3,40,24"]
pytestmark = pytest.mark.multirank


def _parplan(*args: str, launcher: list[str] | None = None, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [*(launcher or []), str(Path(sys.executable).parent / "parplan"), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_a_planned_plan_runs_on_two_ranks_and_equals_the_unsplit_model(repo: Path, tmp_path: Path) -> None:
    plan, out = tmp_path / "plan.json", tmp_path / "meas.json"
    made = _parplan("plan", *UNET, "--profile", "h100", "--devices", "2", "--max-stages", "1", "--out", str(plan),
                    "--json", cwd=repo)
    assert made.returncode == 0, made.stderr
    run = _parplan("run", *UNET, "--plan", str(plan), "--steps", "2", "--warmup", "1", "--verify", "--json",
                   "--out", str(out), cwd=repo)
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)
    assert document == json.loads(out.read_text())
    assert document["format"] == "parplan.measurement/1" and document["launcher"] == "torchrun"
    assert document["nproc"] == 2 and len(document["per_step_s"]) == len(document["loss"]) == 2
    assert document["iteration_s"] > 0 and document["predicted_iteration_s"] == json.loads(plan.read_text())[
        "predicted"]["iteration_s"]
    assert document["verify"]["passed"] and document["verify"]["grad_max_rel_err"] < 1e-3
    memory = document["memory"]  # the measured peak of live tensors beside the plan's prediction
    assert memory["predicted_bytes"] == json.loads(plan.read_text())["predicted"]["memory_bytes_max"]
    assert 0 < memory["peak_bytes"] < document["memory_bytes_max"]  # tensors, not the process's resident size
    assert memory["rel_err"] == pytest.approx((memory["predicted_bytes"] - memory["peak_bytes"]) / memory["peak_bytes"])


@pytest.mark.skipif(shutil.which("mpirun", path=str(Path(sys.executable).parent)) is None
                    and shutil.which("mpirun") is None, reason="no mpirun (make test installs openmpi)")
def test_the_same_run_under_mpirun_with_four_ranks(repo: Path) -> None:
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")
    launcher = [str(mpirun), "-n", "4", "--oversubscribe", *(["--allow-run-as-root"] if os.geteuid() == 0 else [])]
    run = _parplan("run", *UNET, "--layout", "n2·h2", "--steps", "2", "--warmup", "0", "--verify", "--json",
                   launcher=launcher, cwd=repo)
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)  # only rank 0 prints
    assert document["launcher"] == "mpi" and document["nproc"] == 4 and document["backend"] == "gloo"
    assert document["plan"]["summary"].startswith("n2·h2")
    assert document["verify"]["passed"]


def test_a_data_factory_feeds_both_the_split_and_the_unsplit_model(repo: Path) -> None:
    run = _parplan("run", *UNET, "--layout", "h2", "--nproc", "2", "--steps", "1", "--warmup", "0", "--verify",
                   "--dtype", "float64", "--data", "examples/pattern_data.py:batch", "--json", cwd=repo)  # exact
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)
    assert document["verify"]["passed"] and document["loss"][0] > 0


NOISE = """
import torch

def noise(input_box, target_box, step):  # the same values whatever the box: the split sees other data than the unsplit
    torch.manual_seed(step)
    shape = [s.stop - s.start for s in input_box]
    return torch.rand(shape), torch.zeros([s.stop - s.start for s in target_box], dtype=torch.int64)
"""


def test_verify_beyond_its_tolerance_exits_one(repo: Path, tmp_path: Path) -> None:
    (tmp_path / "noise.py").write_text(NOISE)
    run = _parplan("run", *UNET, "--layout", "w2", "--nproc", "2", "--steps", "0", "--verify", "--data",
                   f"{tmp_path / 'noise.py'}:noise", "--json", cwd=repo)
    assert run.returncode == 1, run.stderr
    verified = json.loads(run.stdout)["verify"]
    assert not verified["passed"] and verified["output_max_abs_err"] > 0.1, verified


@pytest.mark.parametrize(("extra", "message"), [
    (["--layout", "h2"], "--layout needs --nproc R"),
    (["--layout", "h3", "--nproc", "2"], "--layout h3 does not divide 2 ranks"),
    (["--layout", "n2", "--nproc", "2", "--backend", "nccl"], "needs CUDA GPUs"),
    (["--layout", "n2", "--nproc", "2", "--backend", "mpi"], "without the MPI backend"),
    (["--layout", "n1", "--nproc", "2", "--stages", "3"], "--stages 3 does not divide 2 ranks"),
    (["--layout", "n1", "--nproc", "2", "--staleness", "1"], "--staleness caps a stale pipeline's staleness"),
    (["--layout", "n1", "--nproc", "2", "--stages", "2", "--slow-stage", "2:2"], "names stage 2 but the plan has 2"),
    (["--layout", "n1", "--nproc", "2", "--stages", "2", "--slow-stage", "x"], "is not K:FACTOR"),
    (["--layout", "n1", "--nproc", "2", "--stages", "2", "--micro-batches", "5"],
     "5 micro-batches of a batch of 4: each needs at least one sample"),
    (["--layout", "n2", "--nproc", "2", "--output", "aux"], "--output aux: the model's output has no such part; it "
                                                            "has one tensor"),
])
def test_bad_run_arguments_are_one_line_and_exit_two(capsys: pytest.CaptureFixture[str], repo: Path,
                                                     extra: list[str], message: str) -> None:
    os.chdir(repo)
    if "nccl" in extra:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    code = main(["run", *UNET, *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_plan_for_other_devices_or_another_model_is_refused(capsys: pytest.CaptureFixture[str], repo: Path,
                                                              tmp_path: Path) -> None:
    os.chdir(repo)
    plan = tmp_path / "plan.json"
    assert main(["plan", *UNET, "--profile", "h100", "--devices", "2", "--max-stages", "1", "--out", str(plan),
                 "--json"]) == 0
    capsys.readouterr()
    assert main(["run", *UNET, "--plan", str(plan), "--nproc", "3"]) == 2
    assert "is for 2 devices but 3 ranks would run it" in capsys.readouterr().err
    other = ["--model", "examples/unet.py:unet", "--input-shape", "4,3,48,24"]
    assert main(["run", *other, "--plan", str(plan)]) == 2
    err = capsys.readouterr().err
    assert "was made for model fingerprint" in err and "traces to" in err


def test_a_stale_pipeline_runs_with_a_straggler_and_reports_its_stages(repo: Path) -> None:
    run = _parplan("run", *UNET, "--layout", "n1", "--nproc", "2", "--stages", "2", "--schedule", "stale",
                   "--steps", "4", "--warmup", "0", "--verify", "--slow-stage", "1:1.5", "--json", cwd=repo)
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)
    pipeline = document["pipeline"]
    assert pipeline["schedule"] == "stale" and pipeline["order"] == "dsp" and pipeline["stages"] == 2
    assert [(s["staleness_achieved"], s["staleness_planned"]) for s in pipeline["per_stage"]] == [(2, 2), (0, 0)]
    assert [s["slowdown"] for s in pipeline["per_stage"]] == [1.0, 1.5]
    assert all(0 < s["busy_s"] <= pipeline["wall_s"] for s in pipeline["per_stage"])
    assert len(document["per_step_s"]) == len(document["loss"]) == 4 and document["verify"]["passed"]


def test_a_sync_pipeline_plan_file_runs_in_gpipe_order_and_is_predicted(repo: Path, tmp_path: Path) -> None:
    import torch

    from calibrate.presets import preset_cluster
    from cost_models.formats.jsonio import write_json_atomic
    from cost_models.ir.model_spec import load_model
    from cost_models.ir.tracing import trace
    from cost_models.layout import Layout
    from cost_models.uniform import staged, uniform_plan

    os.chdir(repo)
    graph = trace(load_model(UNET[1]), (4, 3, 40, 24), torch.float32)
    plan = staged(uniform_plan(graph, preset_cluster("h100", 1), [Layout()]), graph, ["downs_1_0"], "sync", 2)
    path = tmp_path / "pipeline.json"
    write_json_atomic(path, plan.to_dict())
    run = _parplan("run", *UNET, "--plan", str(path), "--order", "gpipe", "--profile", "h100", "--steps", "2",
                   "--warmup", "1", "--verify", "--json", cwd=repo)
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)
    assert document["pipeline"]["order"] == "gpipe" and document["pipeline"]["micro_batches"] == 2
    assert document["plan"]["summary"].endswith("2 stages sync M=2") and document["predicted_iteration_s"] > 0
    assert document["verify"]["passed"] and document["verify"]["grad_max_rel_err"] < 1e-4


def test_uneven_micro_batches_and_stages_of_one_and_more_devices_run_and_verify(repo: Path, tmp_path: Path) -> None:
    """ResNet-18, float64, each verified equal to the unsplit model: a sync pipeline of 1 + 2 devices on a batch of
    5 in 2 micro-batches (3 + 2 samples; the second stage splits them 2 + 1 and 1 + 1); a stale one of 1 + 3
    devices (the second stage n3); and the plan the stage search makes on 2 devices for a batch of 5 with two
    sync stages, whose micro-batches are uneven."""
    from dataclasses import replace
    from functools import partial

    import torch

    from calibrate.presets import preset_cluster, preset_profile
    from cost_models.formats.plan import LayerAssignment, Pipeline, save_plan
    from cost_models.ir.model_spec import load_model
    from cost_models.ir.tracing import trace
    from cost_models.layout import Layout
    from cost_models.uniform import balanced_starts, uniform_plan
    from planner.pipeline.stages import search_pipelines
    from planner.search import assigned_plan
    from planner.settings import SearchSettings

    spec = ["--model", "torchvision:resnet18", "--dtype", "float64"]
    plans = {}
    for name, batch, schedule, micro, second in (("sync-1+2", 5, "sync", 2, 2), ("stale-1+3", 6, "stale", 1, 3)):
        graph = trace(load_model("torchvision:resnet18"), (batch, 3, 64, 64), torch.float64)
        starts = balanced_starts(graph, 2)
        head = set(graph.compute_layers()[:graph.compute_layers().index(starts[0])])
        rule = lambda layer, _, head=head, second=second: [Layout()] if layer in head else [Layout(n=second)]  # noqa: E731
        base = uniform_plan(graph, preset_cluster("h100", second), rule, model_spec="torchvision:resnet18")
        layers = {layer: LayerAssignment(a.layout, 0 if layer in head else 1) for layer, a in base.layers.items()}
        pipeline = Pipeline(2, (1, second), schedule, micro, (1, 0) if schedule == "stale" else (0, 0))
        plans[name] = (batch, replace(base, cluster=preset_cluster("h100", 1 + second), layers=layers,
                                      pipeline=pipeline))
    graph = trace(load_model("torchvision:resnet18"), (5, 3, 64, 64), torch.float64)
    two = preset_cluster("h100", 2)
    searched = search_pipelines(graph, preset_profile("h100"), two, partial(assigned_plan, graph, two),
                                SearchSettings(max_stages=2, schedule="sync"), prune=False)
    uneven = [c.plan for c in searched.candidates if c.plan.pipeline.micro_batches in (2, 3)]  # 3 + 2; 2 + 2 + 1
    assert uneven, [c.plan.summary() for c in searched.candidates]
    # on a cluster of 4 devices, 2 of them idle: the ranks started by default are the plan's stages' (2)
    plans["searched"] = (5, replace(uneven[0], model_spec="torchvision:resnet18", cluster=preset_cluster("h100", 4)))
    for name, (batch, plan) in plans.items():
        save_plan(plan, tmp_path / f"{name}.json")
        run = _parplan("run", *spec, "--input-shape", f"{batch},3,64,64", "--plan", str(tmp_path / f"{name}.json"),
                       "--steps", "1", "--warmup", "0", "--verify", "--json", cwd=repo)
        assert run.returncode == 0, f"{name}: {run.stderr}"
        document = json.loads(run.stdout)
        assert document["verify"]["passed"], (name, document["verify"])
        assert document["verify"]["grad_max_rel_err"] > 0 or name != "sync-1+2"  # the split's sums round differently


def test_a_recomputing_plan_and_one_on_unequal_stages_run_and_verify(repo: Path, tmp_path: Path) -> None:
    """What the stage search emits runs: the UNet at 8×3×64×64 on 2 devices of 13 MB plans two sync stages of
    8 micro-batches whose first recomputes its activations; on 4 devices ResNet-18's 3-stage stale pipelines
    split them 2 + 1 + 1 (or 1 + 2 + 1) — each verified equal to the unsplit model in float64."""
    from dataclasses import replace
    from functools import partial

    import torch

    from calibrate.presets import preset_cluster, preset_profile
    from cost_models.formats.plan import save_plan
    from cost_models.ir.model_spec import load_model
    from cost_models.ir.tracing import trace
    from examples.unet import unet
    from planner.pipeline.stages import search_pipelines
    from planner.search import assigned_plan, plan_model
    from planner.settings import SearchSettings

    model = ["--model", "examples/unet.py:unet", "--input-shape", "8,3,64,64", "--dtype", "float64"]
    graph = trace(unet(), (8, 3, 64, 64), torch.float64)
    cluster = replace(preset_cluster("h100", 2), memory_bytes=13_000_000)
    plan = plan_model(graph, preset_profile("h100"), cluster, SearchSettings(max_stages=2, schedule="sync")).plan
    assert plan.pipeline.recompute == (True, False) and plan.pipeline.micro_batches == 8
    resnet = ["--model", "torchvision:resnet18", "--input-shape", "8,3,32,32", "--dtype", "float64"]
    graph = trace(load_model("torchvision:resnet18"), (8, 3, 32, 32), torch.float64)
    four = preset_cluster("h100", 4)
    searched = search_pipelines(graph, preset_profile("h100"), four, partial(assigned_plan, graph, four),
                                SearchSettings(max_stages=3, schedule="stale"), prune=False)
    unequal = next(replace(c.plan, model_spec="torchvision:resnet18") for c in searched.candidates
                   if len(set(c.plan.pipeline.devices_per_stage)) > 1)
    assert sum(unequal.pipeline.devices_per_stage) == 4 and unequal.pipeline.stages == 3
    for name, made, ranks, spec in (("recompute", plan, "2", model), ("unequal", unequal, "4", resnet)):
        save_plan(made, tmp_path / f"{name}.json")
        run = _parplan("run", *spec, "--plan", str(tmp_path / f"{name}.json"), "--nproc", ranks, "--steps", "1",
                       "--warmup", "0", "--verify", "--json", cwd=repo)
        assert run.returncode == 0, f"{name}: {run.stderr}"
        document = json.loads(run.stdout)
        assert document["verify"]["passed"], (name, document["verify"])
        assert document["pipeline"]["stages"] == made.pipeline.stages


def test_a_layout_that_splits_no_layer_says_so() -> None:
    """``--layout h2`` on a model with no rows to split ran every layer whole and passed without a word (issue 53
    item 6): ``run`` now warns in one line, with the reasons; a layout that splits something says how much."""
    import torch
    from torch import nn

    from cost_models.ir.tracing import trace
    from cost_models.layout import Layout
    from parplan.cli.layouts import uniform_layout_plan
    from parplan.cli.run import _layout_lines

    flat = trace(nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 5)), (4, 3, 8, 8), torch.float32)
    (line,) = _layout_lines(flat, uniform_layout_plan(flat, [Layout(h=2)], 2), "h2")
    assert "splits none of the model's layers" in line and "h2 on 0 of 2 layers" in line
    conv = trace(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1)), (4, 3, 8, 8), torch.float32)
    assert _layout_lines(conv, uniform_layout_plan(conv, [Layout(h=2)], 2), "h2") == [
        "parplan run: note: --layout h2: h2 on 1 of 1 layers"]
    assert _layout_lines(flat, uniform_layout_plan(flat, [Layout()], 1), "n1") == []


def test_a_float32_plan_is_rechecked_in_float64_with_one_command(repo: Path, tmp_path: Path) -> None:
    """``parplan run --plan P --dtype float64 --verify`` runs a float32 plan's layouts in float64 (issue 53 item 6:
    the fingerprint differs by the dtype alone, which was refused), and verifies at 1e-9."""
    plan = tmp_path / "plan.json"
    made = _parplan("plan", *UNET, "--profile", "h100", "--devices", "2", "--max-stages", "1", "--out", str(plan),
                    cwd=repo)
    assert made.returncode == 0, made.stderr
    run = _parplan("run", *UNET, "--plan", str(plan), "--dtype", "float64", "--steps", "1", "--warmup", "0",
                   "--verify", "--json", cwd=repo)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "was made for float32; running its layouts in float64" in run.stderr
    verified = json.loads(run.stdout)["verify"]
    assert verified["passed"] and verified["tolerance"] == 1e-9
    other = _parplan("run", "--model", "examples/unet.py:unet", "--input-shape", "4,3,40,32", "--plan", str(plan),
                     "--dtype", "float64", "--steps", "1", cwd=repo)  # another input: still refused
    assert other.returncode == 2 and "made for model fingerprint" in other.stderr
