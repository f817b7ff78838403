"""Which launcher started this process, and its place in that launcher's job: one reading for every command.

``parplan run``, ``validate`` and ``calibrate`` act as one rank of someone
else's launch when one of these started them (checked in this order):

* **torchrun** (any ``--nnodes``, c10d or static rendezvous): ``RANK`` and
  ``WORLD_SIZE`` are set, with ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
  ``GROUP_RANK`` (the node, as the rendezvous numbered the agents) and
  ``MASTER_ADDR``/``MASTER_PORT``;
* **MPI** (``mpirun``, ``srun --mpi=pmix``): one of :data:`MPI_ENVIRONMENT`;
  rank and size come from mpi4py, the node is the host;
* **Slurm without MPI** (``srun`` of a plain command): ``SLURM_PROCID``,
  ``SLURM_NTASKS``, ``SLURM_LOCALID`` and ``SLURM_NODEID``; the rendezvous
  is ``MASTER_ADDR``/``MASTER_PORT`` where set, else the job's first node
  (``scontrol show hostnames $SLURM_JOB_NODELIST``, or the node list itself
  when it names one host) on a port derived from the job id, the same in
  every task without any exchange (:func:`slurm_rendezvous`).

A node is what the launcher calls one — torchrun's agent, Slurm's node id —
not a host name: two torchrun agents on one host are two nodes, as the
planner's cluster would count them. Ranks fill nodes in order under both
launchers (global rank ``node·local_world_size + local_rank``), as
``Cluster.node_of`` assumes. Reads only the environment (no torch, no MPI
import): the caller asks mpi4py for MPI's numbers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from cost_models.errors import InputError

__all__ = ["ATTEMPT_VARIABLE", "JobPlace", "Launcher", "MPI_ENVIRONMENT", "integer_variable", "job_attempt",
           "launcher_of", "node_label", "place_in_job", "slurm_rendezvous"]

Launcher = Literal["torchrun", "mpi", "slurm"]
"""Which launcher started this process as one rank of its job (:func:`launcher_of`)."""

ATTEMPT_VARIABLE = "PARPLAN_ATTEMPT"
"""Which start of the job this rank belongs to (0 first), the same on every rank: set by ``runtime.launch`` from
the job's store once the rank joined (a torchrun agent's ``TORCHELASTIC_RESTART_COUNT`` counts only its own
restarts: the agent of a healthy node restarts its ranks without counting when another node's rank failed)."""

MPI_ENVIRONMENT = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
"""Variables set by Open MPI, MPICH/Intel MPI (PMI), PMIx launchers (srun --mpi) and MVAPICH in every rank."""

_SLURM = ("SLURM_PROCID", "SLURM_NTASKS")
_SLURM_PORTS = (20000, 12000)
"""A Slurm job's rendezvous port: ``first + job id mod span`` (clear of the ephemeral ports Linux hands out)."""


@dataclass(frozen=True)
class JobPlace:
    """This process's place in a job torchrun or Slurm started (MPI's comes from mpi4py: ``launcher`` only)."""

    launcher: Launcher
    """``torchrun``, ``slurm`` or ``mpi``."""
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: int
    """The node as the launcher numbers it (torchrun's ``GROUP_RANK``, Slurm's ``SLURM_NODEID``)."""

    def __str__(self) -> str:
        return (f"rank {self.rank} of {self.world_size} ({self.launcher}, node {self.node}, "
                f"local rank {self.local_rank})")


def launcher_of(environ: Mapping[str, str] | None = None) -> Launcher | None:
    """``torchrun``, ``mpi`` or ``slurm`` when one of them started this process as a rank (module docstring)."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return "torchrun"
    if any(name in env for name in MPI_ENVIRONMENT):
        return "mpi"
    if all(name in env for name in _SLURM):
        return "slurm"
    return None


def place_in_job(environ: Mapping[str, str] | None = None) -> JobPlace | None:
    """This process's place under torchrun or Slurm; ``None`` outside them (and under MPI: ask mpi4py).

    Raises:
        InputError: A variable of the launcher is not an integer, or the numbers contradict each other.
    """
    env = os.environ if environ is None else environ
    launcher = launcher_of(env)
    if launcher == "torchrun":
        world = integer_variable(env, "WORLD_SIZE")
        place = JobPlace("torchrun", integer_variable(env, "RANK"), world, integer_variable(env, "LOCAL_RANK", 0),
                         integer_variable(env, "LOCAL_WORLD_SIZE", world), integer_variable(env, "GROUP_RANK", 0))
    elif launcher == "slurm":
        world = integer_variable(env, "SLURM_NTASKS")
        place = JobPlace("slurm", integer_variable(env, "SLURM_PROCID"), world,
                         integer_variable(env, "SLURM_LOCALID", 0), _slurm_local_tasks(env, world),
                         integer_variable(env, "SLURM_NODEID", 0))
    else:
        return None
    if not (0 <= place.rank < place.world_size and 0 <= place.local_rank < place.local_world_size <= place.world_size):
        raise InputError(f"the {launcher} environment is inconsistent: {place}, {place.local_world_size} ranks on "
                         f"its node; start the job with {launcher} as documented (docs/multi-node.md)")
    return place


def job_attempt(environ: Mapping[str, str] | None = None) -> int:
    """Which start of the job this is: :data:`ATTEMPT_VARIABLE`, else torchrun's restart count, else 0."""
    env = os.environ if environ is None else environ
    for name in (ATTEMPT_VARIABLE, "TORCHELASTIC_RESTART_COUNT"):
        if env.get(name):
            return integer_variable(env, name)
    return 0


def node_label(hostname: str, environ: Mapping[str, str] | None = None) -> str:
    """What names this rank's node: the launcher's node number where it gives one, else ``hostname``."""
    env = os.environ if environ is None else environ
    launcher = launcher_of(env)
    if launcher == "torchrun" and "GROUP_RANK" in env:
        return f"{hostname}/torchrun node {env['GROUP_RANK']}"
    if launcher == "slurm" and "SLURM_NODEID" in env:
        return f"{hostname}/slurm node {env['SLURM_NODEID']}"
    return hostname


def slurm_rendezvous(environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """Host and port where a Slurm job's ranks meet (rank 0 listens there): module docstring."""
    env = os.environ if environ is None else environ
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return env["MASTER_ADDR"], integer_variable(env, "MASTER_PORT")
    first, span = _SLURM_PORTS
    port = first + integer_variable(env, "SLURM_JOB_ID", 0) % span
    return _first_node(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""), port


def _first_node(node_list: str) -> str:
    if not node_list:
        raise InputError("srun started this process but SLURM_JOB_NODELIST is not set; set MASTER_ADDR and "
                         "MASTER_PORT to rank 0's host and a free port")
    if not any(mark in node_list for mark in "[,"):
        return node_list  # one host
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        raise InputError(f"SLURM_JOB_NODELIST is {node_list!r} and scontrol is not on the PATH to expand it; set "
                         "MASTER_ADDR and MASTER_PORT to rank 0's host and a free port")
    expanded = subprocess.run([scontrol, "show", "hostnames", node_list], capture_output=True, text=True, check=False)
    hosts = expanded.stdout.split()
    if expanded.returncode != 0 or not hosts:
        raise InputError(f"scontrol show hostnames {node_list!r} failed ({expanded.stderr.strip()[:200]}); set "
                         "MASTER_ADDR and MASTER_PORT to rank 0's host and a free port")
    return hosts[0]


def _slurm_local_tasks(env: Mapping[str, str], world: int) -> int:
    """Tasks on this node: ``SLURM_NTASKS_PER_NODE`` where one number, else the tasks over the nodes."""
    per_node = env.get("SLURM_NTASKS_PER_NODE", "")
    if per_node.isdigit():
        return int(per_node)
    nodes = integer_variable(env, "SLURM_NNODES", 1)
    return max(1, world // max(1, nodes))


def integer_variable(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    """The environment variable ``name`` as an integer (``default`` where unset); one line naming it otherwise."""
    value = env.get(name)
    if value is None and default is not None:
        return default
    try:
        if value is None:
            raise TypeError(f"{name} is not set")
        return int(value)
    except (TypeError, ValueError):
        raise InputError(f"environment variable {name} must be an integer, got {value!r}") from None
