"""Volumes (``N,C,D,H,W``) and sequences (``N,C,L``): traced, counted, calibrated, planned and run split by
samples, channels, depth, height and width (a sequence's length as ``w``) and into pipeline stages, equal to
the unsplit model in float64."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from distributed import run_ranks
from runtime_check import split_step_matches, step_cases
from torch import nn

from cost_models.capability.predicate import layer_refusal
from cost_models.errors import InputError
from cost_models.ir.graph import parse_input_shapes
from cost_models.ir.tracing import trace
from cost_models.layout import Layout
from cost_models.local_problem import layer_problem, phases_of

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from cosmoflow import CosmoFlow  # noqa: E402
from signal1d import SignalCNN  # noqa: E402
from unet3d import UNet3d  # noqa: E402

PARPLAN = str(Path(sys.executable).parent / "parplan")


class Sequence1d(nn.Module):
    """A 1-D CNN over a sequence: convolutions, batch-norm, pooling, a global pool and a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(2, 8, 5, padding=2), nn.BatchNorm1d(8), nn.ReLU(), nn.MaxPool1d(2),
                                  nn.Conv1d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool1d(1))
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).flatten(1))


class Mixed3d(nn.Module):
    """Modern volume layers: reflect padding, group- and instance-norm, SiLU, average pooling, trilinear and
    nearest upsampling, a global pool."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(2, 8, 3, padding=1, padding_mode="reflect")
        self.group, self.instance = nn.GroupNorm(2, 8), nn.InstanceNorm3d(8, affine=True)
        self.pool = nn.AvgPool3d(2)
        self.smooth = nn.Upsample(scale_factor=2, mode="trilinear", align_corners=False)
        self.near = nn.Upsample(scale_factor=2, mode="nearest")
        self.head = nn.Sequential(nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(8, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.silu(self.instance(self.group(self.conv(x))))
        return self.head(self.smooth(self.pool(y)) + self.near(self.pool(y)))


class Mixed1d(nn.Module):
    """A 1-D encoder-decoder: a strided convolution down, a transposed one up, linear upsampling, a mean."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.down = nn.Conv1d(2, 8, 3, padding=1), nn.Conv1d(8, 8, 2, stride=2)
        self.up, self.smooth = nn.ConvTranspose1d(8, 8, 2, stride=2), nn.Upsample(scale_factor=2, mode="linear")
        self.pool, self.fc = nn.AvgPool1d(2), nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up(self.down(torch.relu(self.conv(x))))
        return self.fc(self.smooth(self.pool(y)).mean(2))


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "cosmoflow":
        model: nn.Module = CosmoFlow(size=8, blocks=2, width=4, outputs=5)
    elif name == "cosmoflow32":
        model = CosmoFlow(size=32, blocks=3, width=8, outputs=5)
    elif name == "unet3d":  # the segmentation map pooled to five scores (the test's labels are per sample)
        model = nn.Sequential(UNet3d(in_channels=2, classes=5, width=4, depth=2), nn.AdaptiveAvgPool3d(1),
                              nn.Flatten())
    elif name == "mixed3d":
        model = Mixed3d()
    elif name == "mixed1d":
        model = Mixed1d()
    elif name == "signal":
        model = SignalCNN(blocks=3, width=8)
    else:
        model = Sequence1d()
    return model.to(torch.float64).train()


SHAPES = {"cosmoflow": (4, 4, 8, 8, 8), "unet3d": (4, 2, 8, 8, 8), "sequence": (4, 2, 32), "mixed3d": (4, 2, 8, 8, 8),
          "mixed1d": (4, 2, 32)}


def test_volumes_and_sequences_are_read_and_other_ranks_refused_in_one_line() -> None:
    assert parse_input_shapes("2,4,16,16,16") == ((2, 4, 16, 16, 16),)
    assert parse_input_shapes("8,1,4096") == ((8, 1, 4096),)
    for text in ("8,16", "1,2,3,4,5,6"):
        with pytest.raises(InputError, match="N,C,D,H,W volumes"):
            parse_input_shapes(text)


def test_three_d_layers_are_counted_per_voxel() -> None:
    graph = trace(_model("cosmoflow"), SHAPES["cosmoflow"])
    conv, pool = graph.nodes["features_0"], graph.nodes["features_2"]
    assert conv["kind"] == "conv" and conv["flops_fwd"] == 2 * 4 * 4 * 8**3 * 4 * 27  # N·C_out·voxels·C_in·k³
    assert pool["kind"] == "maxpool" and pool["flops_fwd"] == 4 * 4 * 4**3 * 8  # a 2×2×2 window per output


def test_volume_and_sequence_layers_split_by_space_and_channel() -> None:
    for name in ("cosmoflow", "unet3d", "sequence"):
        graph = trace(_model(name), SHAPES[name])
        for layer, data in graph.nodes(data=True):
            if data["kind"] == "input" or len(data["output_shape"]) == 2:
                continue
            assert layer_refusal(data, Layout(n=2)) is None, (name, layer)
            rank = len(data["output_shape"])
            for layout in (Layout(c=2), Layout(d=2), Layout(h=2), Layout(w=2)):
                why = layer_refusal(data, layout)
                pooled = set(data["output_shape"][2:]) == {1}  # a global pool's output: split by channel only
                has_axis = rank == 5 or layout.d == layout.h == 1  # a sequence's one axis is w
                channels_cut = data["kind"] == "cat" and layout.c > 1  # concatenated along the channels
                expected = has_axis and (not pooled or layout.c > 1) and not channels_cut
                assert (why is None) == expected, (name, layer, layout, why)
    image = trace(_model("cosmoflow"), SHAPES["cosmoflow"]).nodes["features_0"] | {"output_shape": [4, 4, 8, 8],
                                                                                  "input_shapes": [[4, 4, 8, 8]]}
    assert "no depth to split" in layer_refusal(image, Layout(d=2))


def test_a_sequence_is_ncw_only_where_its_layers_compute_on_sequences() -> None:
    graph = trace(_model("mixed1d"), SHAPES["mixed1d"])
    orders = {name: data.get("attrs", {}).get("order") for name, data in graph.nodes(data=True)}
    assert orders["conv"] == orders["up"] == orders["smooth"] == "ncw" and orders["mean"] is None

    class Tokens(nn.Module):  # a (N, L, D) value read by a linear layer is no sequence of channels
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(6, 6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.fc(x))

    tokens = trace(Tokens(), (4, 5, 6))
    assert all(not data.get("attrs", {}).get("order") for data in tokens.nodes.values())
    assert layer_refusal(tokens.nodes["relu"], Layout(w=2)) is not None


def test_calibration_builds_every_pass_of_the_volume_and_sequence_problems() -> None:
    from calibrate.kernels import build_kernel

    built = set()
    for name in ("unet3d", "sequence", "mixed3d"):
        graph = trace(_model(name), SHAPES[name])
        for data in graph.nodes.values():  # the tiles of a split are smaller problems of the same kinds
            for layout in (Layout(n=2), Layout(w=2), Layout(d=2, h=2), Layout(c=2)):
                problem = layer_problem(data, layout, "float32")
                if problem is None or problem in built:
                    continue
                built.add(problem)
                for phase in phases_of(problem):
                    build_kernel(problem, phase, torch.device("cpu"))()
    assert any(len(problem.output_shape) == 5 and problem.output_shape[2] == 4 for problem in built)  # d2 of 8


def _cases(rank: int, world: int, cases: Sequence[tuple[str, str]]) -> dict[str, dict[str, str]]:
    return step_cases(cases, world, _model, lambda name: SHAPES[name])


@pytest.mark.multirank
def test_volumes_and_sequences_split_by_samples_equal_the_unsplit_model() -> None:
    cases = [(name, "n2") for name in SHAPES]
    results = run_ranks(_cases, 2, args=(cases,), timeout_s=300)[0]
    for name in SHAPES:  # every layer split (none fell back to whole)
        graph = trace(_model(name), SHAPES[name], torch.float64)
        assert {results[f"{name} n2"][layer] for layer in graph.compute_layers()} == {"n2"}, name


PLANNED = {"cosmoflow32": (1, 4, 32, 32, 32), "unet3d": (1, 2, 16, 16, 16), "signal": (1, 2, 2048)}


def _planned_cases(rank: int, world: int, documents: dict[str, dict[str, Any]]) -> bool:
    from cost_models.formats.plan import Plan

    for name, document in documents.items():
        graph = trace(_model(name), PLANNED[name], torch.float64)
        split_step_matches(lambda: _model(name), Plan.from_dict(document), graph, PLANNED[name], f"{name} planned")
    return True


@pytest.mark.multirank
def test_the_planners_plans_of_one_volume_or_sequence_split_it_and_equal_the_unsplit_model() -> None:
    from calibrate.presets import preset_profile
    from cost_models.cluster import Cluster, Link
    from planner.search import SearchSettings, plan_model

    link = Link(1e-6, 1e10)
    cluster = Cluster(devices=2, devices_per_node=2, memory_bytes=2**34, intra=link, inter=link)
    documents, spatial = {}, False
    for name, shape in PLANNED.items():  # one sample, often too small to gain from a split on a V100: n1 …
        graph, profile = trace(_model(name), shape), preset_profile("v100", "float32")
        plan = plan_model(graph, profile, cluster, SearchSettings(max_stages=1)).plan
        assert plan.predicted is not None
        if all(a.layout.ranks == 1 for a in plan.layers.values()):
            small = replace(cluster, memory_bytes=int(plan.predicted.memory_bytes_max * 0.95))  # … unless it must
            plan = plan_model(graph, profile, small, SearchSettings(max_stages=1)).plan
        assert any(a.layout.spatial * a.layout.c > 1 for a in plan.layers.values()), (name, plan.summary())
        spatial |= any(a.layout.spatial > 1 for a in plan.layers.values())
        exact = trace(_model(name), shape, torch.float64)  # the same layers, checked in float64
        documents[name] = replace(plan, fingerprint=exact.fingerprint, dtype="float64").to_dict()
    assert spatial and all(run_ranks(_planned_cases, 2, args=(documents,), timeout_s=300))


SPLITS = {2: [(name, layout) for name in ("cosmoflow", "unet3d", "mixed3d") for layout in ("d2", "w2", "c2")]
          + [(name, layout) for name in ("sequence", "mixed1d") for layout in ("w2", "c2")],
          4: [(name, layout) for name in ("cosmoflow", "unet3d", "mixed3d")
              for layout in ("h2·w2", "d2·h2", "n2·d2", "c2·d2")]
          + [(name, layout) for name in ("sequence", "mixed1d") for layout in ("n2·w2", "c2·w2")]}


@pytest.mark.multirank
@pytest.mark.parametrize("world", sorted(SPLITS))
def test_volumes_and_sequences_split_by_space_and_channel_equal_the_unsplit_model(world: int) -> None:
    results = run_ranks(_cases, world, args=(SPLITS[world],), timeout_s=600)[0]
    for name, text in SPLITS[world]:  # every volume (sequence) layer took the layout; global pools, heads: samples
        graph, layout = trace(_model(name), SHAPES[name], torch.float64), Layout.parse(text)
        rank = len(SHAPES[name])
        spatial = [layer for layer in graph.compute_layers() if len(graph.nodes[layer]["output_shape"]) == rank
                   and set(graph.nodes[layer]["output_shape"][2:]) != {1}
                   and not (graph.nodes[layer]["kind"] == "cat" and layout.c > 1)]
        assert spatial and {results[f"{name} {text}"][layer] for layer in spatial} == {text}, (name, text)


@pytest.mark.multirank
@pytest.mark.parametrize(("model", "shape", "layout"), [("examples/unet3d.py:unet3d", "2,1,16,16,16", "d2"),
                                                        ("examples/cosmoflow.py:cosmoflow", "2,4,64,64,64", "h2"),
                                                        ("examples/signal1d.py:signal_cnn", "2,2,256", "w2")])
def test_a_volume_and_a_sequence_pipeline_verify_from_the_command_line(tmp_path: Path, model: str, shape: str,
                                                                        layout: str) -> None:
    out = tmp_path / "meas.json"
    run = subprocess.run([PARPLAN, "run", "--model", model, "--input-shape", shape,
                          "--layout", layout, "--stages", "2", "--micro-batches", "2", "--nproc", "4", "--dtype",
                          "float64", "--steps", "1", "--warmup", "0", "--verify", "--out", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    measured: dict[str, Any] = json.loads(out.read_text())
    assert measured["verify"]["passed"] and measured["model"]["input_shape"] == [int(e) for e in shape.split(",")]
    assert layout in measured["plan"]["summary"] and "2 stages" in measured["plan"]["summary"], measured["plan"]
