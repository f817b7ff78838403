"""``--amp``: the forward under autocast with float32 master weights; verified against the unsplit model under the
same autocast; refused, in one line and before any rank starts, where it cannot run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from runtime.precision import Precision, check_amp

PARPLAN = str(Path(sys.executable).parent / "parplan")


def test_the_forward_computes_in_half_precision_and_the_weights_stay_float32() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    seen: list[torch.dtype] = []
    model[0].register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = Precision.of("bf16", torch.device("cpu"))
    with precision.forward():
        loss = nn.functional.cross_entropy(model(torch.randn(2, 3, 8, 8)), torch.tensor([0, 1]))
    precision.backward(loss)
    precision.step(optimizer)
    assert seen == [torch.bfloat16]
    assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
               for p in model.parameters())


def test_fp16_scales_the_loss_and_bf16_does_not() -> None:
    assert Precision.of("fp16", torch.device("cpu")).scaler is not None
    assert Precision.of("bf16", torch.device("cpu")).scaler is None
    assert check_amp("bf16", "float64") is not None and check_amp("bf16", "float32") is None


@pytest.mark.multirank
def test_a_bf16_run_verifies_against_the_unsplit_model_under_the_same_autocast(tmp_path: Path) -> None:
    run = subprocess.run([PARPLAN, "run", "--model", "torchvision:resnet18", "--input-shape", "4,3,32,32",
                          "--layout", "h2", "--nproc", "2", "--steps", "1", "--warmup", "0", "--verify",
                          "--amp", "bf16", "--json"], capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    verified = json.loads(run.stdout)["verify"]
    assert verified["passed"]
    assert verified["grad_floor"] > 100 * torch.finfo(torch.float32).eps  # the floor follows bfloat16's rounding


def test_amp_with_another_dtype_is_refused_before_any_rank_starts() -> None:
    run = subprocess.run([PARPLAN, "run", "--model", "torchvision:resnet18", "--input-shape", "2,3,32,32",
                          "--layout", "n2", "--nproc", "2", "--amp", "bf16", "--dtype", "float64"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 2
    assert "--amp bf16 keeps float32 master weights" in run.stderr and run.stderr.count("\n") == 1
