"""Tier 2: `parplan plan` (one stage) — the written plan, its baselines, and what `estimate` says of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cost_models.formats.plan import load_plan
from cost_models.profile import CommFit, ComputeFit, DeviceSpec, Profile, save_profile
from parplan.cli import main


def test_plan_then_estimate(capsys: pytest.CaptureFixture[str], tmp_path: Path, repo: Path) -> None:
    model = ["--model", f"{repo}/examples/unet.py:unet", "--input-shape", "2,3,64,64"]
    out = tmp_path / "plan.json"
    assert main(["plan", *model, "--profile", "a100", "--devices", "2", "--out", str(out), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    plan = load_plan(out, expected_fingerprint=document["model"]["fingerprint"])
    assert plan.solver is not None and plan.solver.status == "Optimal"
    assert plan.predicted is not None and plan.cluster.devices == 2
    assert {b["name"].split(" (")[0] for b in document["baselines"]} == {"pure sample", "best single layout"}
    assert all(b["speedup"] >= 1 - 1e-9 for b in document["baselines"])
    assert main(["estimate", *model, "--plan", str(out), "--profile", "a100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_s"] == pytest.approx(plan.predicted.iteration_s)


def test_plan_prints_its_summary_first_and_draws_itself(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                         repo: Path) -> None:
    """The plan in one line with its speedups first; the per-layer table only with --table; --plot writes a PNG."""
    model = ["--model", f"{repo}/examples/unet.py:unet", "--input-shape", "1,3,64,64"]
    out, picture = tmp_path / "plan.json", tmp_path / "plan.png"
    assert main(["plan", *model, "--profile", "h100", "--devices", "2", "--out", str(out), "--plot", str(picture)]) == 0
    printed = capsys.readouterr().out
    first = printed.splitlines()[0]
    assert "ms per iteration" in first and "over pure sample" in first, first
    assert "of the 2 devices" in printed  # a batch of one: pure sample parallelism uses one device, the other idles
    assert "plan per layer" not in printed
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plan", *model, "--profile", "h100", "--devices", "2", "--out", str(out), "--table"]) == 0
    assert "plan per layer" in capsys.readouterr().out
    assert main(["plan", *model, "--profile", "h100", "--devices", "2", "--out", str(out), "--plot", "x.gif"]) == 2
    assert "by suffix" in capsys.readouterr().err


def test_nothing_fits_says_by_how_much(capsys: pytest.CaptureFixture[str], tmp_path: Path, repo: Path) -> None:
    tiny = Profile(DeviceSpec("tiny", 2**20), {"source": "measured"},
                   compute_fits=tuple(ComputeFit("*", p, 1e-6, 1e-10, 1e-10, 3) for p in ("fwd", "bwd", "bwd_data",
                                                                                           "bwd_weight")),
                   comm_fits=tuple(CommFit(c, "intra", 1e-5, 1e-9, 3) for c in ("allreduce", "allgather",
                                                                               "reduce_scatter", "all_to_all",
                                                                               "sendrecv")))
    save_profile(tiny, tmp_path / "tiny.json")
    code = main(["plan", "--model", f"{repo}/examples/unet.py:unet", "--input-shape", "2,3,64,64", "--profile",
                 str(tmp_path / "tiny.json"), "--devices", "2", "--out", str(tmp_path / "plan.json")])
    err = capsys.readouterr().err
    assert code == 2 and "no plan fits" in err and "GiB per rank" in err and err.count("\n") == 1
    assert not (tmp_path / "plan.json").exists()
