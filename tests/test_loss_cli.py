"""``--loss`` on the command line: ``parplan run --verify`` and ``parplan check`` under a Dice-type loss, a
regression loss and a loss that cannot be kept split, on split layouts and two-stage pipelines, in float64 —
the loss value and every gradient against the unsplit model under the same loss; a ``--loss`` that names
nothing, or takes no target the model's output allows, is bad input (exit 2, before any rank starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

UNET = ["--model", "examples/unet.py:unet", "--input-shape", "2,3,24,16"]
pytestmark = pytest.mark.multirank


def _parplan(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "parplan"), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(("loss", "layout"), [  # single-stage layouts: the check test below
    ("tests/small_losses.py:monai_dice_ce", ["--layout", "h2", "--stages", "2", "--nproc", "4"]),
    ("tests/small_losses.py:tversky", ["--layout", "n1", "--stages", "2", "--nproc", "2"]),
])
def test_run_verifies_the_loss_and_gradients_under_the_users_loss(repo: Path, loss: str, layout: list[str]) -> None:
    run = _parplan("run", *UNET, *layout, "--loss", loss, "--dtype", "float64", "--steps", "1", "--warmup", "0",
                   "--verify", "--json", cwd=repo)
    assert run.returncode == 0, run.stderr[-3000:]
    verified = json.loads(run.stdout)["verify"]
    assert verified["passed"] and verified["loss_rel_err"] <= 1e-9, verified
    assert verified["grad_max_rel_err"] <= 1e-9, verified


def test_a_loss_that_cannot_stay_split_is_gathered_with_a_warning(repo: Path) -> None:
    """On a pipeline's split last stage: the output gathered there, one warning line, still exact."""
    run = _parplan("run", *UNET, "--layout", "h2", "--stages", "2", "--nproc", "4", "--loss",
                   "tests/small_losses.py:counted_by_hand", "--dtype", "float64", "--steps", "1", "--warmup", "0",
                   "--verify", "--json", cwd=repo)
    assert run.returncode == 0, run.stderr[-3000:]
    verified = json.loads(run.stdout)["verify"]
    assert verified["passed"] and verified["loss_rel_err"] <= 1e-9, verified
    assert run.stderr.count("gathered on every rank") == 1, run.stderr[-2000:]  # once, on one line
    assert "parplan run: warning: the loss counted_by_hand is taken of the whole output" in run.stderr
    assert "numel of a split value" in run.stderr


@pytest.mark.parametrize(("model", "loss", "layouts"), [
    (UNET, "dice", "h2,w2"),
    (["--model", "tests/small_models.py:monai_unet3d", "--input-shape", "2,1,16,16,16"],
     "tests/small_losses.py:monai_dice_ce", "d2,n2"),
])
def test_check_verifies_every_layout_under_the_loss(repo: Path, model: list[str], loss: str, layouts: str) -> None:
    done = _parplan("check", *model, "--layouts", layouts, "--devices", "", "--loss", loss, "--verify-dtype",
                    "float64", "--json", cwd=repo)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert [c["result"] for c in report["checks"]] == ["pass"] * 3, report


@pytest.mark.parametrize(("loss", "says"), [
    ("nope", "not a built-in loss"),
    ("torch.nn.functional:pad", "takes none of the targets tried"),
])
def test_a_bad_loss_is_refused_before_any_rank_starts(repo: Path, loss: str, says: str) -> None:
    run = _parplan("run", *UNET, "--layout", "h2", "--nproc", "2", "--loss", loss, cwd=repo)
    assert run.returncode == 2 and says in run.stderr and run.stderr.count("\n") == 1, run.stderr
