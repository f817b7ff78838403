"""Beyond one machine: ``parplan run`` as a rank of torchrun, and as one of two agents (two "nodes" on 127.0.0.1).

Every run is real (ranks on gloo, float64, ``--verify`` against the unsplit
model); the two agents meet in one c10d rendezvous as two hosts would, so the
job has two nodes of two ranks — the plan must be made for nodes of two.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cost_models.errors import InputError
from processes.job import launcher_of, node_label, place_in_job, slurm_rendezvous

pytestmark = pytest.mark.multirank

RESNET = ["--model", "torchvision:resnet18", "--input-shape", "4,3,32,32", "--dtype", "float64"]
BIN = Path(sys.executable).parent


def _env(fault: str = "") -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "PARPLAN_FAULT"}
    env.update({"OMP_NUM_THREADS": "1", "PARPLAN_TEST_TAG": uuid.uuid4().hex})
    if fault:
        env["PARPLAN_FAULT"] = fault
    return env


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _two_agents(command: list[str], cwd: Path, fault: str = "") -> list[subprocess.CompletedProcess[str]]:
    """``command`` (after the program) started twice at once, as two hosts of one job would; both results."""
    env = _env(fault)
    agents = [subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(2)]
    done = []
    for agent in agents:
        out, err = agent.communicate(timeout=600)
        done.append(subprocess.CompletedProcess(command, agent.returncode, out, err))
    return done


def _reported(agents: list[subprocess.CompletedProcess[str]]) -> dict[str, Any]:
    """Rank 0's measurement: the one agent that printed it (the other, rank 2's node, prints nothing)."""
    for agent in agents:
        assert agent.returncode == 0, agent.stderr[-3000:]
    documents = [json.loads(agent.stdout) for agent in agents if agent.stdout.strip()]
    assert len(documents) == 1, [agent.stdout[:200] for agent in agents]
    return documents[0]


def _nodes_of_two(plan: Any) -> Any:
    from cost_models.cluster import Cluster

    cluster = plan.cluster
    return replace(plan, cluster=Cluster(devices=4, devices_per_node=2, memory_bytes=cluster.memory_bytes,
                                         intra=cluster.intra, inter=cluster.inter, name="two nodes of two"))


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A spatial plan (``n2·h2`` on 4 ranks) and a 2-stage pipeline (``h2`` per stage), for nodes of 2 and of 4."""
    import torch

    from cost_models.formats.plan import save_plan
    from cost_models.ir.model_spec import load_model
    from cost_models.ir.tracing import trace
    from cost_models.layout import Layout
    from cost_models.uniform import balanced_starts, staged
    from parplan.cli.layouts import uniform_layout_plan

    folder = tmp_path_factory.mktemp("plans")
    graph = trace(load_model("torchvision:resnet18"), [(4, 3, 32, 32)], torch.float64)
    spatial = uniform_layout_plan(graph, [Layout.parse("n2·h2")], 4, "torchvision:resnet18")
    stage = uniform_layout_plan(graph, [Layout.parse("h2")], 2, "torchvision:resnet18")
    pipeline = staged(stage, graph, balanced_starts(graph, 2), "sync", 2)
    found = {"spatial": _nodes_of_two(spatial), "pipeline": _nodes_of_two(pipeline), "one node of 4": spatial}
    paths = {}
    for name, plan in found.items():
        paths[name] = folder / f"{name.replace(' ', '-')}.json"
        save_plan(plan, paths[name])
    return paths


STEPS = ["--layout", "n2", "--steps", "2", "--json"]


@pytest.fixture(scope="module")
def own_losses(repo: Path) -> list[float]:
    """``parplan run --layout n2 --nproc 2`` (its own agent): the losses every launcher must give."""
    ours = subprocess.run([str(BIN / "parplan"), "run", *RESNET, *STEPS, "--nproc", "2"], cwd=repo, env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert ours.returncode == 0, ours.stderr[-3000:]
    losses = json.loads(ours.stdout)["loss"]
    assert len(losses) == 2
    return losses


def test_torchrun_standalone_runs_parplan_run_as_its_ranks_with_the_losses_of_nproc_bit_for_bit(
        repo: Path, own_losses: list[float]) -> None:
    torchrun = subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "--no-python",
                               str(BIN / "parplan"), "run", *RESNET, *STEPS], cwd=repo, env=_env(),
                              capture_output=True, text=True, timeout=600)
    assert torchrun.returncode == 0, torchrun.stderr[-3000:]
    launched = json.loads(torchrun.stdout)  # rank 0 alone prints
    assert launched["nproc"] == 2 and launched["launcher"] == "torchrun" and launched["loss"] == own_losses


@pytest.mark.parametrize("name", ["spatial", "pipeline"])
def test_two_agents_as_two_nodes_run_a_plan_for_nodes_of_two_and_verify(name: str, plans: dict[str, Path],
                                                                         repo: Path) -> None:
    agents = _two_agents([str(BIN / "parplan"), "run", *RESNET, "--plan", str(plans[name]), "--nnodes", "2",
                          "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--steps", "1", "--warmup", "0",
                          "--verify", "--json"], repo)
    document = _reported(agents)
    assert document["nproc"] == 4 and document["verify"]["passed"], document["verify"]


def test_a_killed_rank_on_the_second_node_is_survived_with_max_restarts(plans: dict[str, Path], repo: Path,
                                                                         tmp_path: Path) -> None:
    """Rank 3 (the second node's) dies at step 2; both agents start their ranks again from the checkpoint of step 1,
    and the losses are those of an uninterrupted run."""
    common = [*RESNET, "--plan", str(plans["spatial"]), "--steps", "3", "--warmup", "0", "--json"]
    clean = subprocess.run([str(BIN / "parplan"), "run", *common, "--nproc", "4"], cwd=repo, env=_env(),
                           capture_output=True, text=True, timeout=600)
    assert clean.returncode == 0, clean.stderr[-3000:]
    agents = _two_agents([str(BIN / "parplan"), "run", *common, "--nnodes", "2", "--rdzv-endpoint",
                          f"127.0.0.1:{_free_port()}", "--checkpoint-every", "1", "--checkpoint-dir", str(tmp_path),
                          "--max-restarts", "1"], repo, fault="kill:3:2")
    document = _reported(agents)
    assert document["loss"] == json.loads(clean.stdout)["loss"]
    assert document["recovery"]["restarts"] == 1
    assert any("rank 3 kills at step 2" in agent.stderr for agent in agents)


def test_a_plan_for_other_nodes_than_the_jobs_is_refused_before_any_rank_starts(
        plans: dict[str, Path], repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from parplan.cli import main

    monkeypatch.chdir(repo)
    code = main(["run", *RESNET, "--plan", str(plans["one node of 4"]), "--nnodes", "2", "--rdzv-endpoint",
                 f"127.0.0.1:{_free_port()}"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "was made for nodes of 4 devices but this job runs 2 ranks on each of its nodes" in err
    assert "--devices-per-node 2" in err


TORCHRUN_RANK = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}  # refused before it would join


@pytest.mark.parametrize("launched, flags, message", [
    ({}, ["--nnodes", "2"], "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
    ({}, ["--nnodes", "2", "--rdzv-endpoint", "h:1", "--node-rank", "2"], "--node-rank 2 but --nnodes 2"),
    ({}, ["--node-rank", "1"], "--node-rank and --rdzv-endpoint are for a job of several hosts"),
    (TORCHRUN_RANK, ["--nproc", "3"], "--nproc 3 but torchrun started 2 ranks"),
    (TORCHRUN_RANK, ["--nnodes", "2"], "torchrun started this process as one rank: give the node count to torchrun"),
    (TORCHRUN_RANK, ["--max-restarts", "1", "--checkpoint-dir", "ck"], "--max-restarts is torchrun's here"),
])
def test_node_flags_that_cannot_work_are_one_line(launched: dict[str, str], flags: list[str], message: str,
                                                  repo: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from parplan.cli import main

    monkeypatch.chdir(repo)
    for name, value in launched.items():
        monkeypatch.setenv(name, value)
    code = main(["run", *RESNET, "--layout", "n2", *(["--nproc", "2"] if not launched else []), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_the_launcher_and_this_ranks_place_are_read_from_the_environment() -> None:
    torchrun = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}
    place = place_in_job(torchrun)
    assert launcher_of(torchrun) == "torchrun" and place is not None
    assert (place.rank, place.world_size, place.local_rank, place.local_world_size, place.node) == (3, 4, 1, 2, 1)
    assert node_label("host", torchrun) == "host/torchrun node 1"  # two agents on one host are two nodes
    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
             "SLURM_NNODES": "4", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu17"}
    place = place_in_job(slurm)
    assert launcher_of(slurm) == "slurm" and place is not None
    assert (place.rank, place.world_size, place.local_rank, place.local_world_size, place.node) == (5, 8, 1, 2, 2)
    assert slurm_rendezvous(slurm) == ("gpu17", 20000 + 4242 % 12000)
    assert slurm_rendezvous({**slurm, "MASTER_ADDR": "a", "MASTER_PORT": "7"}) == ("a", 7)
    assert launcher_of({**slurm, "PMIX_RANK": "5"}) == "mpi" and launcher_of({**slurm, **torchrun}) == "torchrun"
    assert launcher_of({}) is None and place_in_job({}) is None
    with pytest.raises(InputError, match="SLURM_NTASKS must be an integer"):
        place_in_job({**slurm, "SLURM_NTASKS": "x"})
    with pytest.raises(InputError, match="inconsistent"):
        place_in_job({**torchrun, "RANK": "4"})


def test_a_calibration_under_two_torchrun_agents_measures_the_between_node_level(tmp_path: Path) -> None:
    """Two agents of one rank each on this host: two nodes as torchrun defines them, so the pairs across them are
    timed as the between-node level (a profile ``parplan plan`` prices node-crossing collectives from)."""
    from cost_models.profile import load_profile

    out = tmp_path / "profile.json"
    agents = _two_agents([str(BIN / "torchrun"), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                          "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--rdzv-id", uuid.uuid4().hex, "--no-python",
                          str(BIN / "parplan"), "calibrate", "--model", "torchvision:resnet18", "--input-shape",
                          "2,3,32,32", "--budget-s", "20", "--out", str(out), "--json"], tmp_path)
    for agent in agents:
        assert agent.returncode == 0, agent.stderr[-3000:]
    profile = load_profile(out)
    assert profile.meta["ranks"] == 2
    assert {s.level for s in profile.comm_samples} == {"inter"}  # every pair of ranks spans the two nodes
    assert any(fit.level == "inter" and fit.collective == "sendrecv" for fit in profile.comm_fits)
    assert list(tmp_path.iterdir()) == [out]  # rank 0 alone wrote


def test_srun_without_mpi_runs_parplan_run_as_its_tasks(repo: Path, own_losses: list[float]) -> None:
    """Two tasks with the variables ``srun`` gives a plain command (no MPI, no torchrun): the losses of
    ``--nproc 2``; the rendezvous is ``MASTER_ADDR``/``MASTER_PORT`` (else the job's first node: unit-tested)."""
    port, job = _free_port(), str(uuid.uuid4().int % 10**6)
    tasks = []
    for task in range(2):
        env = {**_env(), "SLURM_PROCID": str(task), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(task),
               "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": "localhost",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        tasks.append(subprocess.Popen([str(BIN / "parplan"), "run", *RESNET, *STEPS], cwd=repo, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [task.communicate(timeout=600) for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], [err[-2000:] for _, err in outputs]
    assert outputs[1][0] == ""  # task 1 reports nothing
    launched = json.loads(outputs[0][0])
    assert launched["launcher"] == "slurm" and launched["nproc"] == 2 and launched["loss"] == own_losses
