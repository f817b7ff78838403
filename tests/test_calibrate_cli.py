"""Tier 3: `parplan calibrate` for real — compute kernels plus a 2-rank gloo run — and `parplan profile show`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cost_models.profile import load_profile
from parplan.cli import main


@pytest.mark.multirank
def test_calibrate_two_ranks_then_show(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    code = main(["calibrate", "--model", "examples.unet:unet", "--input-shape", "2,3,32,32", "--ranks", "2",
                 "--budget-s", "240", "--out", str(out), "--json"])
    # calibration stops when every part is measured (~60 s here alone): the budget is room for a loaded machine,
    # where the split forms are admitted only if twice their predicted time fits in what is left of it
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["profile"] == str(out) and summary["measured"] > 0
    assert summary["seconds"] <= 1.5 * 240  # the budget kept, loosely: a loaded VM's rank start-up runs over it
    profile = load_profile(out)
    assert profile.is_measured and profile.meta["ranks"] == 2 and profile.meta["backend"] == "gloo"
    assert {s.kind for s in profile.compute_samples} >= {"conv", "batchnorm"}
    assert {(f.collective, f.level) for f in profile.comm_fits} >= {("allreduce", "intra"), ("sendrecv", "intra")}
    assert all(s.group == 2 and s.median_s > 0 for s in profile.comm_samples)
    assert profile.meta["problems_measured"] + profile.meta["left_to_fit"] == profile.meta["problems_total"]
    assert {f.optimizer for f in profile.optimizer_fits} == {"sgd", "momentum", "adam"}
    forms = profile.corrections  # the split forms ran on the ranks (calibrate.split_forms)
    assert forms is not None and forms.fitted_on["source"] == "calibrate", profile.meta["notes"]
    assert {run.split(" ")[0] for run in forms.fitted_on["runs"]} >= {"n2", "c2", "h2"}
    assert forms.layer_scale and all("·" in key for key in forms.layer_scale) and forms.step_overhead_s == 0

    assert main(["profile", "show", str(out), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    for part in ("compute", "comm"):
        assert set(shown["fit"][part]) == {"median_rel_err", "p90_rel_err", "n"}
    assert shown["device"]["name"].startswith("CPU")
    assert main(["profile", "show", str(out)]) == 0
    assert "held-out error" in capsys.readouterr().out


def test_show_presets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "show", "a100", "--dtype", "bfloat16", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["meta"]["source"] == "datasheet" and shown["fit"]["compute"]["n"] == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["profile", "show", "a10"], "unknown preset 'a10'"),
        (["profile", "show", "missing.json"], "profile file missing.json does not exist"),
        (["profile", "show", "v100", "--dtype", "bfloat16"], "no bfloat16 peak"),
        (["calibrate", "--model", "torchvision:resnet18", "--input-shape", "1,3,8,8", "--out", "/nonexistent/p.json"],
         "directory /nonexistent does not exist"),
        (["calibrate", "--model", "torchvision:resnet18", "--input-shape", "1,3,8,8", "--devices", "0,2",
          "--out", "p.json"], "must list device counts >= 1"),
        (["calibrate", "--model", "torchvision:resnet18", "--input-shape", "2,3,16,16", "--ranks", "2",
          "--backend", "nccl", "--budget-s", "5", "--out", "{tmp}/p.json"], "nccl"),
    ],
)
def test_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], message: str) -> None:
    code = main([arg.replace("{tmp}", str(tmp_path)) for arg in argv])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert not (tmp_path / "p.json").exists()


def test_corrupt_profile(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text('{"format": "parplan.profile/1", "meta": {}}')
    assert main(["profile", "show", str(tmp_path / "p.json")]) == 2
    assert "is not a valid parplan.profile/1 document" in capsys.readouterr().err


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["calibrate", "--model", "m:f", "--input-shape", "1,3,8,8", "--out", "p.json", "--budget-s", "-3"])
    assert info.value.code == 2
    assert "must be a positive finite number" in capsys.readouterr().err


LAUNCHERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--no-python"],
    "mpirun": [str(Path(sys.executable).with_name("mpirun")), "--allow-run-as-root", "--oversubscribe", "-np", "2"],
}


@pytest.mark.multirank
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_calibrate_under_a_launcher_uses_every_rank(tmp_path: Path, launcher: str) -> None:
    if launcher == "mpirun" and not Path(LAUNCHERS["mpirun"][0]).exists():
        pytest.skip("Open MPI's mpirun is not installed in this environment")
    out = tmp_path / "profile.json"
    command = LAUNCHERS[launcher] + [str(Path(sys.executable).with_name("parplan")), "calibrate", "--model",
                                      "torchvision:resnet18", "--input-shape", "2,3,32,32", "--budget-s", "20",
                                      "--out", str(out), "--json"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=180, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    profile = load_profile(out)
    assert profile.meta["ranks"] == 2 and profile.compute_samples
    measured = {s.collective for s in profile.comm_samples}
    assert measured and all(s.group == 2 for s in profile.comm_samples)  # timed on both ranks
    # every collective, or the profile says the budget ran out (a loaded machine reaches fewer in 20 s)
    assert measured >= {"allreduce", "allgather", "all_to_all", "sendrecv"} or \
        any("did not fit in the budget" in note for note in profile.meta["notes"]), (measured, profile.meta["notes"])
    assert list(tmp_path.iterdir()) == [out]  # only rank 0 wrote, atomically


def test_ctrl_c_still_writes_a_valid_profile(tmp_path: Path) -> None:
    import signal
    import time

    out = tmp_path / "profile.json"
    command = [str(Path(sys.executable).with_name("parplan")), "calibrate", "--model", "torchvision:resnet18",
               "--input-shape", "8,3,64,64", "--devices", "1,2,4", "--budget-s", "300", "--out", str(out)]
    # A child inherits an ignored SIGINT (pytest started in the background): give it the default back.
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert child.stderr is not None
    first = child.stderr.readline()  # printed when kernel timing starts
    assert first.startswith("timing compute kernels"), first
    time.sleep(3)
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=60)
    assert child.returncode == 130, stderr
    assert "(interrupted)" in stdout
    profile = load_profile(out)
    assert profile.meta["interrupted"] is True and 0 < profile.meta["problems_measured"] < profile.meta["problems_total"]
    assert list(tmp_path.iterdir()) == [out]


def test_profile_from_another_torch_is_shown_with_a_warning(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from cost_models.profile import DeviceSpec, Profile, save_profile

    old = Profile(DeviceSpec("CPU old", 2**30), {"source": "measured", "torch_version": "1.13.0", "dtype": "float16"})
    save_profile(old, tmp_path / "old.json")
    assert main(["profile", "show", str(tmp_path / "old.json"), "--json"]) == 0
    (warning,) = json.loads(capsys.readouterr().out)["warnings"]
    assert "measured with torch 1.13.0" in warning
    assert any("is for float16, the model runs in float32" in w for w in old.compatibility_warnings("1.13.0", "float32"))
