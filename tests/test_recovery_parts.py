"""The parts of failure handling and checkpoints that need no ranks: messages, faults, shards, gathering, pruning."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from cost_models.errors import InputError
from runtime import checkpoint
from runtime.checkpoint import Progress, State
from runtime.fault_injection import Fault, Schedule, disk_full, planned, strike
from runtime.pipeline.schedules import dsp, dsp_after, forwarded_after
from runtime.pipeline.worker import _segments
from runtime.slicing import ParameterSlice
from runtime.waiting import RankFailure, at, describe, exchange, in_backward, place, reason

GLOO_TIMEOUT = "[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete"
GLOO_CLOSED = "[../gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:9128"


def test_backend_errors_become_one_line_naming_rank_exchange_peers_and_place() -> None:
    assert reason(RuntimeError(GLOO_TIMEOUT)) == "timed out after 3 s (a peer hung or is far behind)"
    assert reason(RuntimeError(GLOO_CLOSED)) == "lost the connection to a peer (it died)"
    assert reason(RuntimeError("first line\nsecond")) == "first line"
    with pytest.raises(RankFailure) as caught, at("step 4"), at("forward"), at("layer conv2"):
        with exchange("the halo exchange along H", [0, 1]):
            raise RuntimeError(GLOO_TIMEOUT)
    assert str(caught.value) == ("rank 0: timed out after 3 s (a peer hung or is far behind) in the halo exchange "
                                 "along H with rank 1 (step 4, forward, layer conv2)")
    assert place() == ()
    assert in_backward(("step 4", "forward", "layer conv2")) == ("step 4", "backward", "layer conv2")
    assert in_backward(("step 4",)) == ("step 4", "backward")
    assert describe("the gradient allreduce", [0, 2, 3], (), RuntimeError(GLOO_CLOSED)) == \
        "rank 0: lost the connection to a peer (it died) in the gradient allreduce with ranks 2, 3"


def test_an_exchange_leaves_other_errors_and_its_own_alone() -> None:
    with pytest.raises(ValueError), exchange("x"):
        raise ValueError("not a backend error")
    original = RankFailure("rank 1: already named")
    with pytest.raises(RankFailure) as caught, exchange("outer"):
        raise original
    assert caught.value is original


@pytest.mark.parametrize("text", ["kill", "kill:1", "boom:1:2", "kill:-1:2", "kill:1:0", "kill:x:2", "kill:1:2:3"])
def test_a_malformed_fault_is_one_clear_error(text: str) -> None:
    with pytest.raises(InputError, match="PARPLAN_FAULT="):
        planned(text)


def test_a_fault_strikes_only_its_rank_and_step_and_only_its_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    assert planned("") is None and planned("hang:2:7") == Schedule((Fault("hang", 2, 7),))
    assert str(planned("kill:1:7, kill:0:19")) == "kill:1:7,kill:0:19"
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    faults = Schedule((Fault("exit", 1, 3),))
    strike(faults, 0, 3)  # another rank
    strike(faults, 1, 2)  # another step
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    strike(faults, 1, 3)  # a restarted group runs clean past the schedule
    strike(None, 1, 3)


@pytest.mark.parametrize("attempt", [0, 1, 2])
def test_a_schedule_of_faults_gives_each_attempt_its_own(monkeypatch: pytest.MonkeyPatch, attempt: int) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(attempt))
    faults = planned("kill:1:7,full:0:19")
    assert faults is not None and faults.now() == (Fault("kill", 1, 7), Fault("full", 0, 19), None)[attempt]
    monkeypatch.setenv("PARPLAN_FAULT", "kill:1:7,full:0:19")
    if attempt == 1:  # the full disk strikes the checkpoint's write, not the step's start
        strike(faults, 0, 19)
        with pytest.raises(OSError, match="No space left on device"):
            disk_full(0, 19, Path("shard.pt"))
    disk_full(1, 19, Path("shard.pt"))  # another rank writes


def test_the_rest_of_a_stale_schedule_after_an_update_is_what_the_whole_one_does_next() -> None:
    for batches in range(1, 8):
        for staleness in range(5):
            events = dsp(batches, staleness)
            assert dsp_after(batches, staleness, 0) == events
            for updates in range(1, batches + 1):
                rest = dsp_after(batches, staleness, updates)
                head = events[:len(events) - len(rest)]
                assert head[-1].kind == "U" and sum(e.kind == "U" for e in head) == updates
                forwarded = {e.batch for e in head if e.kind == "F"}
                assert forwarded == set(range(forwarded_after(batches, staleness, updates)))
    with pytest.raises(ValueError, match="has 3 updates, not 4"):
        dsp_after(3, 1, 4)


def test_pipeline_segments_end_at_warmup_and_at_each_checkpoint_of_a_sync_pipeline() -> None:
    assert _segments(0, 2, 8, 0) == [range(0, 2), range(2, 8)]
    assert _segments(0, 0, 7, 3) == [range(0, 3), range(3, 6), range(6, 7)]
    assert _segments(4, 1, 8, 3) == [range(4, 6), range(6, 8)]
    assert _segments(8, 1, 8, 3) == []


def _shard_state(rank: int, full: nn.Module) -> State:
    """Rank ``rank`` of 2 holding half of ``weight`` (rows) and the whole ``bias``, with SGD momentum."""
    rows = (0, 2) if rank == 0 else (2, 4)
    weight = nn.Parameter(full.weight.detach()[rows[0]:rows[1]].clone())
    bias = nn.Parameter(full.bias.detach().clone())
    optimizer = torch.optim.SGD([weight, bias], lr=0.1, momentum=0.9)
    weight.grad, bias.grad = torch.ones_like(weight) * (rank + 1), torch.ones_like(bias)
    optimizer.step()
    return State(parameters={"weight": weight, "bias": bias}, buffers={"seen": torch.tensor([3.0 + rank])},
                 slices={"weight": ParameterSlice("weight", 0, rows[0], rows[1], 4)}, optimizer=optimizer)


def _write_checkpoint(folder: Path, step: int, states: list[State]) -> dict:
    """What ``checkpoint.save`` writes, without ranks: one shard per state and the manifest."""
    plan = {"format": "parplan.plan/3", "model": {"spec": "m", "fingerprint": "sha256:0123456789", "dtype": "float32",
                                                  "input_shape": [2, 1, 4, 4]},
            "cluster": {"devices": len(states)}, "layers": [], "pipeline": {}}
    target = checkpoint.step_folder(folder, step)
    target.mkdir(parents=True)
    entries = []
    for rank, state in enumerate(states):
        data = checkpoint._serialise(checkpoint._shard(Progress(step, [0.5], [0.1]), state, {"plan": plan}, rank))
        (target / f"rank-{rank:05d}.pt").write_bytes(data)
        entries.append({"rank": rank, "file": f"rank-{rank:05d}.pt", "bytes": len(data),
                        "sha256": hashlib.sha256(data).hexdigest()})
    manifest = checkpoint._manifest(Progress(step), {"plan": plan, "seed": 0, "warmup": 0}, entries)
    (target / "manifest.json").write_text(json.dumps(manifest))
    return checkpoint.read_manifest(target)


def test_gathering_joins_slices_keeps_replicas_and_maps_optimizer_state_by_name(tmp_path: Path) -> None:
    full = nn.Linear(3, 4)
    states = [_shard_state(rank, full) for rank in range(2)]
    manifest = _write_checkpoint(tmp_path, 2, states)
    gathered = checkpoint.gather(manifest)
    torch.testing.assert_close(gathered["parameters"]["weight"], torch.cat([s.parameters["weight"] for s in states]))
    torch.testing.assert_close(gathered["parameters"]["bias"], states[0].parameters["bias"])
    momentum = gathered["optimizer"]["state"]["weight"]["momentum_buffer"]
    torch.testing.assert_close(momentum, torch.cat([torch.ones(2, 3), 2 * torch.ones(2, 3)]))
    assert gathered["buffers"]["seen"].item() == 3.0 and gathered["losses"] == [0.5]
    path = checkpoint.write_full(manifest)
    assert torch.load(path, weights_only=True)["parameters"].keys() == {"weight", "bias"}
    assert "full" in checkpoint.latest(tmp_path)


def test_a_version_1_manifest_still_reads_and_its_plan_digests_as_its_version_2_form(tmp_path: Path) -> None:
    manifest = _write_checkpoint(tmp_path, 2, [_shard_state(r, nn.Linear(3, 4)) for r in range(2)])
    old = {key: value for key, value in manifest.items() if key not in ("folder", "run", "torch", "in_flight")} | {
        "format": "parplan.checkpoint/1"}
    old["plan"] = old["plan"] | {"format": "parplan.plan/1"}
    (Path(manifest["folder"]) / "manifest.json").write_text(json.dumps(old))
    assert checkpoint.read_manifest(Path(manifest["folder"]))["format"] == "parplan.checkpoint/1"
    layer = {"name": "conv", "stage": 0, "layout": {"n": 2, "c": 1, "h": 1, "w": 1}}
    first = {"layers": [layer], "pipeline": {}, "cluster": {"devices": 2}}
    second = first | {"layers": [layer | {"layout": layer["layout"] | {"d": 1}}]}
    assert checkpoint.plan_digest(first) == checkpoint.plan_digest(second)
    third = second | {"pipeline": {"recompute": [True]}}  # a /3 plan's recomputation changes no shard
    assert checkpoint.plan_digest(third) == checkpoint.plan_digest(first)
    assert checkpoint.plan_digest(first) != checkpoint.plan_digest(
        first | {"layers": [layer | {"layout": layer["layout"] | {"d": 2}}]})
    (Path(manifest["folder"]) / "manifest.json").write_text(json.dumps(old | {"format": "parplan.checkpoint/5"}))
    with pytest.raises(InputError, match="'parplan.checkpoint/5' but this parplan reads 'parplan.checkpoint/4'"):
        checkpoint.read_manifest(Path(manifest["folder"]))


def test_a_state_loads_its_slice_of_the_gathered_form(tmp_path: Path) -> None:
    full = nn.Linear(3, 4)
    gathered = checkpoint.gather(_write_checkpoint(tmp_path, 2, [_shard_state(r, full) for r in range(2)]))
    fresh = _shard_state(1, nn.Linear(3, 4))
    checkpoint._copy_into(gathered["parameters"], fresh.parameters, fresh, "parameter")
    fresh.optimizer.load_state_dict(checkpoint._optimizer_for(gathered["optimizer"], fresh))
    torch.testing.assert_close(fresh.parameters["weight"], gathered["parameters"]["weight"][2:4])
    buffer = fresh.optimizer.state[fresh.parameters["weight"]]["momentum_buffer"]
    torch.testing.assert_close(buffer, 2 * torch.ones(2, 3))
    wrong = State(parameters={"weight": nn.Parameter(torch.zeros(5, 3))}, buffers={}, slices={},
                  optimizer=fresh.optimizer)
    with pytest.raises(InputError, match="has shape"):
        checkpoint._copy_into(gathered["parameters"], wrong.parameters, wrong, "parameter")


def test_a_damaged_or_incomplete_checkpoint_is_refused_by_name(tmp_path: Path) -> None:
    full = nn.Linear(3, 4)
    manifest = _write_checkpoint(tmp_path, 2, [_shard_state(r, full) for r in range(2)])
    shard = Path(manifest["folder"]) / "rank-00001.pt"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(InputError, match="does not match the digest"):
        checkpoint.gather(manifest)
    lonely = _write_checkpoint(tmp_path / "one", 4, [_shard_state(0, full)])
    with pytest.raises(InputError, match="lacks rows 2…4 of weight"):
        checkpoint.gather(lonely)


def test_only_the_two_newest_complete_checkpoints_are_kept(tmp_path: Path) -> None:
    full = nn.Linear(3, 4)
    for step in (2, 4, 6):
        _write_checkpoint(tmp_path, step, [_shard_state(0, full), _shard_state(1, full)])
    (tmp_path / "step-00000008").mkdir()  # being written: newer than the newest complete one, kept
    checkpoint._prune(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004", "step-00000006", "step-00000008"]
    assert checkpoint.latest(tmp_path)["step"] == 6


def test_the_agents_report_names_a_killed_rank_first_and_passes_bad_input_on() -> None:
    from types import SimpleNamespace

    from runtime.launch import _bad_input, _failure_line

    def failure(exitcode: int, timestamp: int, message: object) -> SimpleNamespace:
        return SimpleNamespace(exitcode=exitcode, timestamp=timestamp, message=message)

    killed = SimpleNamespace(failures={0: failure(1, 3, {"message": "RankFailure: rank 0: lost the connection"}),
                                       1: failure(-9, 4, "")})
    assert _failure_line(killed, 0) == ("rank 1 died (SIGKILL); rank 0 failed (exit code 1): RankFailure: rank 0: "
                                        "lost the connection")
    assert _failure_line(killed, 2).endswith("(after 2 restarts)") and _bad_input(killed) is None
    damaged = SimpleNamespace(failures={1: failure(1, 5, "Traceback …\ncost_models.errors.InputError: file x is "
                                                         "damaged; remove it")})
    assert _bad_input(damaged) == "file x is damaged; remove it"


def test_a_shard_this_torch_cannot_load_names_both_torch_versions(tmp_path: Path) -> None:
    manifest = _write_checkpoint(tmp_path, 2, [_shard_state(r, nn.Linear(3, 4)) for r in range(2)])
    folder = Path(manifest["folder"])
    unreadable = b"not a torch.save archive of this version"
    (folder / "rank-00001.pt").write_bytes(unreadable)
    entries = [e | {"bytes": len(unreadable), "sha256": hashlib.sha256(unreadable).hexdigest()} if e["rank"] == 1
               else e for e in manifest["shards"]]
    document = {k: v for k, v in manifest.items() if k != "folder"} | {"shards": entries, "torch": "1.13.1"}
    (folder / "manifest.json").write_text(json.dumps(document))
    expected = (f"cannot load checkpoint file {folder}/rank-00001.pt (written by torch 1.13.1, this is torch "
                f"{torch.__version__}): not a tensor archive this torch reads without unpickling code; resume with "
                "the torch that wrote it")
    with pytest.raises(InputError, match=re.escape(expected)):
        checkpoint.load_shard(checkpoint.read_manifest(folder), 1)
    assert checkpoint.load_shard(checkpoint.read_manifest(folder), 0)["step"] == 2  # the other still loads
