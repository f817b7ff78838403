"""Mixed precision priced as it runs: a graph traced under autocast records each layer's compute dtype; the cost
model keeps weights, gradients, optimizer state and the gradient allreduce in float32 and prices activations,
kernels and redistribution in each layer's own dtype; calibration times the kernels in it; plans are single-stage."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from cost_models.estimate import estimate
from cost_models.ir.graph import LayerGraph, amp_of, compute_fingerprint
from cost_models.ir.tracing import trace
from cost_models.layout import Layout
from cost_models.uniform import uniform_plan
from parplan.api import load_profile

PARPLAN = str(Path(sys.executable).parent / "parplan")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.norm = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.norm(self.conv1(x)))
        return self.fc(self.conv2(y).mean((2, 3)))


SHAPE = (8, 3, 32, 32)


def _pair() -> tuple[LayerGraph, LayerGraph]:
    model = _Net()
    return trace(model, SHAPE), trace(model, SHAPE, amp="bf16")


def test_a_graph_traced_under_autocast_records_each_layers_compute_dtype() -> None:
    plain, mixed = _pair()
    assert mixed.graph["dtype"] == "float32" and mixed.graph["amp"] == "bfloat16" and amp_of(mixed) == "bf16"
    dtypes = {data["kind"]: data.get("dtype") for _, data in mixed.nodes(data=True)}
    assert dtypes["conv"] == dtypes["linear"] == dtypes["batchnorm"] == "bfloat16"
    assert dtypes["input"] is None  # the input stays the weights' dtype
    assert all("dtype" not in data for _, data in plain.nodes(data=True)) and amp_of(plain) == ""
    conv1 = "conv1"
    assert mixed.nodes[conv1]["activation_bytes"] * 2 == plain.nodes[conv1]["activation_bytes"]
    assert mixed.nodes[conv1]["param_bytes"] == plain.nodes[conv1]["param_bytes"]  # float32 master weights


def test_the_fingerprint_tells_mixed_precision_apart_and_survives_json() -> None:
    plain, mixed = _pair()
    half = trace(_Net(), SHAPE, amp="fp16")
    assert len({plain.graph["fingerprint"], mixed.graph["fingerprint"], half.graph["fingerprint"]}) == 3
    again = LayerGraph.from_dict(mixed.to_dict())
    assert again.graph["amp"] == "bfloat16" and compute_fingerprint(again) == mixed.graph["fingerprint"]


def _layers(graph: LayerGraph, layout: Layout) -> dict[str, object]:
    profile = load_profile("h100", dtype="bfloat16")
    plan = uniform_plan(graph, profile.cluster(2), [layout, Layout(n=2), Layout()], "test")
    return {layer.name: layer for layer in estimate(graph, plan, profile).layers}


def test_weights_stay_float32_and_activations_follow_the_layers_dtype() -> None:
    plain, mixed = _pair()
    full, half = _layers(plain, Layout(n=2)), _layers(mixed, Layout(n=2))
    for name in ("conv1", "conv2", "fc"):
        assert half[name].memory.weights == full[name].memory.weights  # type: ignore[attr-defined]
        assert half[name].cost.allreduce_s == pytest.approx(full[name].cost.allreduce_s)  # type: ignore[attr-defined]
    relu = next(name for name, data in mixed.nodes(data=True) if data["kind"] == "activation")
    assert half[relu].memory.saved_own * 2 == full[relu].memory.saved_own  # type: ignore[attr-defined]
    weights = mixed.nodes["conv2"]["params"]
    # conv2 keeps its bfloat16 input and autocast's bfloat16 copy of its weights for backward
    assert half["conv2"].memory.saved == full["conv2"].memory.saved // 2 + 2 * weights  # type: ignore[attr-defined]


def test_redistribution_is_priced_in_the_moved_tensors_dtype() -> None:
    plain, mixed = _pair()
    full, half = _layers(plain, Layout(h=2)), _layers(mixed, Layout(h=2))
    moved = [name for name, layer in full.items() if layer.redistribution_s > 0]  # type: ignore[attr-defined]
    assert moved
    for name in moved:
        assert 0 < half[name].redistribution_s < full[name].redistribution_s  # type: ignore[attr-defined]


def test_calibration_times_the_kernels_in_the_autocast_dtype() -> None:
    from calibrate.problems import enumerate_problems

    _, mixed = _pair()
    dtypes = {m.problem.kind: m.problem.dtype for m in enumerate_problems(mixed, [1, 2])}
    assert dtypes["conv"] == dtypes["linear"] == "bfloat16"


def test_a_profile_calibrated_without_amp_warns_on_a_mixed_precision_model() -> None:
    from cost_models.profile import Profile

    profile = load_profile("h100")
    measured = Profile.from_dict({**profile.to_dict(), "meta": {**profile.meta, "source": "measured"}})
    assert any("calibrated with no mixed precision" in w for w in measured.compatibility_warnings("x", None, "bfloat16"))
    assert not measured.compatibility_warnings(measured.meta.get("torch_version", "x"), None, "")


def test_plans_under_amp_are_single_stage() -> None:
    from parplan.cli.args import search_settings

    args = argparse.Namespace(max_stages=4, schedule="auto", max_staleness=None, solver="cbc", time_limit_s=None,
                              optimizer="sgd", amp="bf16")
    assert search_settings(args).max_stages == 1
    assert search_settings(argparse.Namespace(**{**vars(args), "amp": None})).max_stages == 4


def test_amp_with_another_dtype_is_refused_by_plan_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    run = subprocess.run([PARPLAN, "plan", "--model", "torchvision:resnet18", "--input-shape", "8,3,32,32",
                          "--profile", "h100", "--devices", "4", "--amp", "bf16", "--dtype", "float64",
                          "--out", str(out)], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 2 and not out.exists()
    assert "--amp bf16 keeps float32 master weights" in run.stderr and run.stderr.count("\n") == 1


def test_a_plan_under_amp_is_single_stage_and_records_the_mixed_graph(tmp_path: Path) -> None:
    from cost_models.formats.plan import load_plan

    out = tmp_path / "plan.json"
    run = subprocess.run([PARPLAN, "plan", "--model", "torchvision:resnet18", "--input-shape", "8,3,64,64",
                          "--profile", "h100", "--devices", "8", "--amp", "bf16", "--max-stages", "4",
                          "--out", str(out), "--json"], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    plan = load_plan(out)
    assert plan.pipeline.stages == 1
    assert plan.fingerprint == trace(__import__("torchvision").models.resnet18(), (8, 3, 64, 64),
                                     amp="bf16").graph["fingerprint"]
