"""Tier 1: ``benchmarks/gpu_check.py`` without a GPU (one line, exit 0) and its guarded steps, budget and profiles.

The GPU steps themselves need a CUDA machine; here only what runs anywhere:
the no-GPU exit, a failing or hanging step recorded while the check goes on,
a step the budget no longer allows, and the profile with a preset's links
that the what-if uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import gpu_check, gpu_steps
from benchmarks.gpu_check import Clock, Report, Settings

REPO = Path(__file__).resolve().parents[1]


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(tmp_path: Path) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = tmp_path / "check.json"
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["gpu_check: no CUDA GPU here (torch.cuda.is_available() is false); "
                                        "nothing to check"]
    assert not out.exists()


def _report(tmp_path: Path) -> Report:
    settings = Settings(out=tmp_path / "check.json", budget_s=60.0, device="cpu", ranks=1, steps=1, warmup=0,
                        whatif_devices="8", cases=())
    return Report(settings, time.monotonic())


def test_a_failing_step_is_recorded_with_its_command_and_the_check_goes_on(tmp_path: Path) -> None:
    report, clock = _report(tmp_path), Clock(time.monotonic() + 600)
    failing = [sys.executable, "-c", "import sys; print('bad model', file=sys.stderr); sys.exit(2)"]
    assert gpu_check.run_step(report, clock, "fails", failing, 60.0) is None
    assert gpu_check.run_step(report, clock, "works", [sys.executable, "-c", "print('{\"x\": 1}')"], 60.0) == {"x": 1}
    assert gpu_check.guarded(report, "raises", lambda: 1 / 0) is None
    first, second, third = report.document["steps"]
    assert (first["step"], first["rc"], first["error"]) == ("fails", 2, "bad model")
    assert first["command"].startswith("python3 -c ")
    assert second["rc"] == 0 and "error" not in second
    assert third["error"].startswith("ZeroDivisionError")
    assert (tmp_path / "check.json").exists()  # rewritten after every step


def test_a_hanging_step_is_stopped_at_its_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_steps, "MIN_STEP_S", 0.0)
    report, clock = _report(tmp_path), Clock(time.monotonic() + 600)
    started = time.monotonic()
    assert gpu_check.run_step(report, clock, "hangs", [sys.executable, "-c", "import time; time.sleep(60)"], 1.0) is None
    assert time.monotonic() - started < 30
    entry = report.document["steps"][0]
    assert entry["rc"] is None and entry["error"].startswith("timed out after 1 s")


def test_a_step_the_budget_no_longer_allows_is_skipped(tmp_path: Path) -> None:
    report = _report(tmp_path)
    assert gpu_check.run_step(report, Clock(time.monotonic()), "late", [sys.executable, "-c", "pass"], 60.0) is None
    assert report.document["steps"][0]["skipped"].startswith("budget")


def test_the_measured_profile_gets_the_nearest_presets_links(tmp_path: Path) -> None:
    from calibrate.presets import preset_profile
    from cost_models.profile import load_profile, save_profile

    measured = replace(preset_profile("a100"), comm_fits=(), meta={"source": "measured", "dtype": "float32"})
    save_profile(measured, tmp_path / "measured.json")
    found = gpu_check.linked_profile(tmp_path / "measured.json", gpu_check.nearest_preset("NVIDIA H200"),
                                     tmp_path / "linked.json")
    assert found == {"profile": str(tmp_path / "linked.json"), "links_from": "h100", "devices_per_node": 8}
    linked = load_profile(tmp_path / "linked.json")
    assert linked.compute_fits == measured.compute_fits and linked.comm_fits == preset_profile("h100").comm_fits
    assert linked.cluster(64).devices_per_node == 8


def test_small_helpers() -> None:
    assert gpu_check.nearest_preset("Tesla V100-SXM2-16GB") == "v100"
    assert gpu_check.nearest_preset("NVIDIA A100-SXM4-80GB") == "a100"
    assert gpu_check.nearest_preset("NVIDIA RTX 6000 Ada") == "h100" and gpu_check.nearest_preset(None) == "h100"
    assert [gpu_check.power_of_two_at_most(n) for n in (1, 2, 3, 6, 8, 16)] == [1, 2, 2, 4, 8, 8]
    assert gpu_check.rel_err(1.1, 1.0) == pytest.approx(0.1) and gpu_check.rel_err(None, 1.0) is None
    assert gpu_check.rel_err(1.0, 0.0) is None
