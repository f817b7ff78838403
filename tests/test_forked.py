"""Ranks forked from a fork server take their launcher's environment, not the server's (``processes.forked``).

A process starts its fork server once; ``parplan run`` called again in the same process (a test, a caller's
script) after changing the environment must start ranks that see the change, as spawned ranks would.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from distributed import run_ranks

from parplan.cli.main import main


def _environment(rank: int, world_size: int, launcher: dict[str, str]) -> dict[str, str]:
    from processes.forked import take_environment

    os.environ["PARPLAN_TEST_STARTER"] = str(rank)  # as torch elastic sets RANK over the server's environment
    take_environment(launcher)
    return dict(os.environ)


def test_a_forked_rank_takes_its_launchers_environment_and_keeps_what_its_starter_set() -> None:
    launcher = {name: value for name, value in os.environ.items() if name != "PATH"}
    launcher |= {"PARPLAN_TEST_NEW": "1", "HOME": "/elsewhere"}
    for rank, seen in enumerate(run_ranks(_environment, world_size=2, args=(launcher,))):
        assert seen["PARPLAN_TEST_NEW"] == "1" and seen["HOME"] == "/elsewhere"  # added and changed since
        assert "PATH" not in seen  # removed since
        assert seen["PARPLAN_TEST_STARTER"] == str(rank)


def _nothing(rank: int, world_size: int) -> int:
    return rank


def _frozen(rank: int, world_size: int) -> tuple[int, bool]:
    import gc

    import torch

    return gc.get_freeze_count(), any(obj is torch.nn.Module for obj in gc.get_objects())


def test_what_the_fork_server_preloaded_is_frozen_for_the_ranks_collector() -> None:
    from processes.forked import server_preload

    assert server_preload(["torch", "processes.preloaded", "torch", "processes.forked", "timm"]) == [
        "processes.forked", "torch", "timm", "processes.preloaded"]
    for frozen, collected in run_ranks(_frozen, world_size=2):
        assert frozen > 100_000  # import torch's objects, which a collection would otherwise write to
        assert not collected  # torch's classes are not among what the rank's collections examine


def test_a_fault_set_after_the_fork_server_started_strikes_the_next_run(monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert run_ranks(_nothing, world_size=2) == [0, 1]  # this process's fork server runs, without the fault
    monkeypatch.setenv("PARPLAN_FAULT", "exit:1:1")
    args: list[Any] = ["run", "--model", "torchvision:resnet18", "--input-shape", "2,3,32,32", "--layout", "n2",
                       "--nproc", "2", "--steps", "2", "--warmup", "0"]
    assert main(args) == 1
    assert "rank 1" in capsys.readouterr().err
