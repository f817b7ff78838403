"""Failures and recovery of ``parplan run``: dead and hung ranks, checkpoints, resume and elastic restarts.

Failures are injected with ``PARPLAN_FAULT=KIND:RANK:STEP`` (``runtime.fault_injection``).
Every run is real: 2–4 ranks on gloo, started by torchrun's machinery or by
``mpirun``, training the example UNet in float64 so that a resumed run's
losses can be compared with an uninterrupted run's exactly.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from distributed import survivors

pytestmark = pytest.mark.multirank

UNET = ["--model", "examples/unet.py:unet", "--input-shape", "4,3,40,24", "--dtype", "float64", "--warmup", "0"]
STEPS = ["--steps", "6"]
MPIRUN = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")


def _parplan(*args: str, cwd: Path, fault: str = "", launcher: list[str] | None = None,
             tag: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PARPLAN_TEST_TAG": tag or uuid.uuid4().hex}
    env.pop("PARPLAN_FAULT", None)
    if fault:
        env["PARPLAN_FAULT"] = fault
    mpi = [*(launcher or []), *(["-x", "PARPLAN_FAULT"] if launcher and fault else [])]
    command = [*mpi, str(Path(sys.executable).parent / "parplan"), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _losses(run: subprocess.CompletedProcess[str]) -> list[float]:
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)["loss"]


def _mpirun(ranks: int) -> list[str]:
    assert MPIRUN is not None
    return [MPIRUN, "-n", str(ranks), "--oversubscribe", *(["--allow-run-as-root"] if os.geteuid() == 0 else [])]


@pytest.fixture(scope="module")
def uninterrupted(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Six steps on two ranks (h2) without a failure: the reference trajectory, and its weights at the end."""
    folder = tmp_path_factory.mktemp("reference")
    run = _parplan("run", *UNET, *STEPS, "--layout", "h2", "--nproc", "2", "--checkpoint-every", "6",
                   "--checkpoint-dir", str(folder), "--json", cwd=repo)
    assert run.returncode == 0, run.stderr[-3000:]
    return {**json.loads(run.stdout), "checkpoint_dir": folder}


@pytest.fixture(scope="module")
def interrupted(repo: Path,
                tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str], str]:
    """The same run with a checkpoint every 2 steps, rank 1 killed at the start of step 4."""
    folder = tmp_path_factory.mktemp("checkpoints")
    tag = uuid.uuid4().hex
    run = _parplan("run", *UNET, *STEPS, "--layout", "h2", "--nproc", "2", "--checkpoint-every", "2",
                   "--checkpoint-dir", str(folder), "--json", cwd=repo, fault="kill:1:4", tag=tag)
    return folder, run, tag


def test_a_killed_rank_stops_the_others_names_itself_and_leaves_no_process(interrupted: Any) -> None:
    folder, run, tag = interrupted
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip().splitlines()[-1] == "parplan run: error: rank 1 died (SIGKILL)"
    assert survivors(tag) == []
    assert sorted(p.name for p in folder.iterdir()) == ["step-00000002"]  # step 4's never began


def test_resuming_continues_the_uninterrupted_losses_exactly_keeping_the_runs_plan_and_flags(
        interrupted: Any, uninterrupted: dict[str, Any], repo: Path, tmp_path: Path) -> None:
    """Without --layout and --checkpoint-every the resume keeps the checkpoint's plan and its checkpoints."""
    folder = tmp_path / "ck"
    shutil.copytree(interrupted[0], folder)
    resumed = _parplan("run", *UNET, *STEPS, "--nproc", "2", "--checkpoint-dir", str(folder), "--resume", "--json",
                       cwd=repo)
    assert _losses(resumed) == uninterrupted["loss"]  # float64, bit for bit
    assert f"resuming with the checkpoint's --checkpoint-every 2, its plan ({folder}/step-00000002)" in resumed.stderr
    recovery = json.loads(resumed.stdout)["recovery"]
    assert len(recovery.pop("checkpoint_s")) == 2
    assert recovery == {"resumed_from_step": 2, "restarts": 0, "checkpoint_dir": str(folder), "checkpoints": [4, 6]}


def test_a_resume_says_which_flag_given_again_differs_and_passes_over_a_damaged_checkpoint(
        interrupted: Any, uninterrupted: dict[str, Any], repo: Path, tmp_path: Path) -> None:
    """A corrupt shard (its digest differs) of the newest checkpoint: the ranks pass over it, one line says so,
    and the one before it continues the run — as intact as it was."""
    folder = tmp_path / "ck"
    shutil.copytree(interrupted[0], folder)
    damaged = folder / "step-00000003"
    shutil.copytree(folder / "step-00000002", damaged)
    manifest = json.loads((damaged / "manifest.json").read_text())
    (damaged / "manifest.json").write_text(json.dumps(manifest | {"step": 3}))
    shard = damaged / "rank-00001.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    resumed = _parplan("run", *UNET, *STEPS, "--layout", "h2", "--nproc", "2", "--checkpoint-dir", str(folder),
                       "--resume", "--checkpoint-every", "3", "--json", cwd=repo)
    assert _losses(resumed) == uninterrupted["loss"]
    assert "resuming with --checkpoint-every 3 (the checkpoint's run had 2)" in resumed.stderr
    warnings = [line for line in resumed.stderr.splitlines() if "passing over" in line]
    assert len(warnings) == 1 and f"the damaged checkpoint {damaged}: checkpoint file {shard} does not match the " \
        "digest in its manifest" in warnings[0], resumed.stderr
    assert json.loads(resumed.stdout)["recovery"]["resumed_from_step"] == 2


def test_an_elastic_restart_after_a_killed_rank_gives_the_same_losses(uninterrupted: dict[str, Any], repo: Path,
                                                                     tmp_path: Path) -> None:
    run = _parplan("run", *UNET, *STEPS, "--layout", "h2", "--nproc", "2", "--checkpoint-every", "3",
                   "--checkpoint-dir", str(tmp_path), "--max-restarts", "1", "--json", cwd=repo, fault="kill:0:5")
    assert _losses(run) == uninterrupted["loss"]
    recovery = json.loads(run.stdout)["recovery"]
    assert len(recovery.pop("checkpoint_s")) == 1
    assert recovery == {"resumed_from_step": 3, "restarts": 1, "checkpoint_dir": str(tmp_path), "checkpoints": [6]}
    assert "parplan: fault: rank 0 kills at step 5" in run.stderr


def test_a_resume_on_four_ranks_in_two_pipeline_stages_from_the_gathered_form_trains_the_same(
        interrupted: Any, repo: Path, uninterrupted: dict[str, Any], tmp_path: Path) -> None:
    """From 2 ranks h2 to 2 stages of 2 ranks h2 each (1 micro-batch: the same training), checkpointing again."""
    import torch

    shutil.copytree(interrupted[0], tmp_path / "ck")
    gathered = _parplan("checkpoint", "gather", "--checkpoint-dir", str(tmp_path / "ck"), "--json", cwd=repo)
    assert gathered.returncode == 0, gathered.stderr
    full = torch.load(json.loads(gathered.stdout)["file"], weights_only=True)
    shard = torch.load(tmp_path / "ck" / "step-00000002" / "rank-00001.pt", weights_only=True)  # h2: all whole
    assert full["format"] == "parplan.checkpoint-full/1" and full["step"] == 2
    for name, tensor in shard["parameters"].items():
        torch.testing.assert_close(full["parameters"][name], tensor, rtol=0, atol=0)
    resumed = _parplan("run", *UNET, *STEPS, "--layout", "h2", "--stages", "2", "--micro-batches", "1", "--nproc",
                       "4", "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "2", "--resume",
                       "--json", cwd=repo)
    torch.testing.assert_close(_losses(resumed), uninterrupted["loss"], rtol=1e-12, atol=1e-12)
    assert json.loads(resumed.stdout)["recovery"]["checkpoints"] == [4, 6]
    for folder in (tmp_path / "ck", uninterrupted["checkpoint_dir"]):  # each stage saved its own part
        assert _parplan("checkpoint", "gather", "--checkpoint-dir", str(folder), cwd=repo).returncode == 0
    ours = torch.load(tmp_path / "ck" / "step-00000006" / "full.pt", weights_only=True)
    theirs = torch.load(uninterrupted["checkpoint_dir"] / "step-00000006" / "full.pt", weights_only=True)
    assert ours["parameters"].keys() == theirs["parameters"].keys()
    torch.testing.assert_close(ours["parameters"], theirs["parameters"], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("extra", "refusal"), [
    (["--steps", "6", "--checkpoint-every", "2"], "already holds checkpoints"),
    (["--steps", "1", "--resume"], "past this run's end"),
    (["--steps", "6", "--resume", "--seed", "1"], "was made with --dtype float64 --seed 0 --warmup 0"),
])
def test_a_folder_of_another_run_and_a_checkpoint_it_cannot_continue_are_refused(
        interrupted: Any, repo: Path, capsys: pytest.CaptureFixture[str], extra: list[str], refusal: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from parplan.cli import main

    monkeypatch.chdir(repo)
    argv = ["run", *UNET, "--layout", "h2", "--nproc", "2", "--checkpoint-dir", str(interrupted[0]), *extra]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and refusal in lines[0], lines


def test_a_hung_rank_makes_the_others_exit_within_the_timeout_naming_the_exchange(repo: Path) -> None:
    tag = uuid.uuid4().hex
    started = time.time()
    run = _parplan("run", *UNET, "--steps", "3", "--layout", "h2", "--nproc", "2", "--timeout-s", "4", cwd=repo,
                   fault="hang:1:2", tag=tag)
    ended = time.time()
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"parplan run: error: rank 0 failed \(exit code 1\): RankFailure: rank 0: timed out after "
                        r"4 s \(a peer hung or is far behind\) in the halo exchange along H with rank 1 \(step 2, "
                        r"forward, layer \w+\)", last), last
    struck = float(re.search(r"parplan: fault: rank 1 hangs at step 2 \(t=([0-9.]+)\)", run.stderr).group(1))
    assert struck > started and 4 <= ended - struck < 4 + 15  # the timeout, then the agent's stop and exit
    assert survivors(tag) == []


@pytest.mark.skipif(MPIRUN is None, reason="no mpirun (make test installs openmpi)")
def test_under_mpirun_a_hung_rank_aborts_the_job_and_a_resume_gives_the_same_losses(
        interrupted: Any, uninterrupted: dict[str, Any], repo: Path) -> None:
    tag = uuid.uuid4().hex
    hung = _parplan("run", *UNET, "--steps", "3", "--layout", "h2", "--timeout-s", "4", cwd=repo, fault="hang:1:2",
                    launcher=_mpirun(2), tag=tag)
    assert hung.returncode != 0
    assert "parplan run: error: rank 0: timed out after 4 s" in hung.stderr and "halo exchange" in hung.stderr
    assert survivors(tag) == []
    folder, _, _ = interrupted
    resumed = _parplan("run", *UNET, *STEPS, "--layout", "h2", "--checkpoint-dir", str(folder), "--resume",
                       "--json", cwd=repo, launcher=_mpirun(2))
    assert _losses(resumed) == uninterrupted["loss"]


STALE = ["--model", "torchvision:resnet18", "--input-shape", "4,3,32,32", "--dtype", "float64", "--warmup", "0",
         "--steps", "8", "--layout", "n1", "--stages", "2", "--schedule", "stale", "--nproc", "2", "--json"]


def test_a_stale_pipeline_checkpoints_in_flight_and_a_kill_and_resume_keep_its_losses_bit_for_bit(
        repo: Path, tmp_path: Path) -> None:
    """DSP keeps batches in flight across a checkpoint (no drain): checkpointing every 3 updates, killed at step 6
    of 8 and resumed from the checkpoint of step 3, the run's losses are those of the run without checkpoints."""
    import torch

    plain = _losses(_parplan("run", *STALE, cwd=repo))
    killed = _parplan("run", *STALE, "--checkpoint-every", "3", "--checkpoint-dir", str(tmp_path), cwd=repo,
                      fault="kill:1:6")
    assert killed.returncode == 1 and "rank 1 died (SIGKILL)" in killed.stderr
    manifest = json.loads((tmp_path / "step-00000003" / "manifest.json").read_text())
    assert manifest["in_flight"] and manifest["run"] == {"checkpoint_every": 3, "order": "1f1b", "staleness": None,
                                                        "lr": 0.01}
    first = torch.load(tmp_path / "step-00000003" / "rank-00000.pt", weights_only=True)["in_flight"]
    assert sorted(first["stash"]) == [3, 4]  # stage 0 (staleness 2) holds steps 4 and 5 in flight
    last = torch.load(tmp_path / "step-00000003" / "rank-00001.pt", weights_only=True)["in_flight"]
    assert last["stash"] == {} and sorted(last["ahead"]) == [3, 4]  # what stage 0 had sent, received ahead
    resumed = _parplan("run", *STALE, "--checkpoint-dir", str(tmp_path), "--resume", cwd=repo)
    assert _losses(resumed) == plain  # float64, bit for bit
    assert json.loads(resumed.stdout)["recovery"]["checkpoints"] == [6]  # --checkpoint-every 3 kept


def test_a_full_disk_while_writing_a_shard_is_one_line_and_leaves_the_checkpoint_before_usable(
        uninterrupted: dict[str, Any], repo: Path, tmp_path: Path) -> None:
    """``full:1:4``: rank 1 cannot write its shard of step 4 (ENOSPC): no manifest, the folder removed, one line
    naming the rank, the error and the intact checkpoint; the resume from it gives the same losses."""
    run = _parplan("run", *UNET, *STEPS, "--layout", "h2", "--nproc", "2", "--checkpoint-every", "2",
                   "--checkpoint-dir", str(tmp_path), "--json", cwd=repo, fault="full:1:4")
    assert run.returncode == 1 and run.stdout == ""
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("parplan run: error: rank ") and (
        f"could not write checkpoint {tmp_path}/step-00000004 (rank 1: [Errno 28] No space left on device: "
        f"'{tmp_path}/step-00000004/rank-00001.pt'); the checkpoint in {tmp_path}/step-00000002 is intact") in last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002"]
    resumed = _parplan("run", *UNET, *STEPS, "--layout", "h2", "--nproc", "2", "--checkpoint-dir", str(tmp_path),
                       "--resume", "--json", cwd=repo)
    assert _losses(resumed) == uninterrupted["loss"]
