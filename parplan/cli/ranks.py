"""Who starts a command's ranks, and how many: this host's agent (``--nproc``), one host of several (``--nnodes``),
or a launcher that started this process as one rank (torchrun, ``srun``, ``mpirun``: ``processes.job``).

Refused before any rank starts (one line, exit 2): ``--nproc`` that disagrees
with the launcher's world size, ``--nnodes`` under a launcher (it has its own),
a plan whose devices do not divide into the hosts, and a plan made for nodes
of another size than the job's (:func:`check_placement`): the planner priced
which ranks share a node, so the job must put them there.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cost_models.errors import InputError
from parplan.cli.args import non_negative_int, positive_int
from processes.job import launcher_of, place_in_job

if TYPE_CHECKING:
    from cost_models.formats.plan import Plan
    from runtime.launch import Nodes

__all__ = ["JobRanks", "add_node_arguments", "check_placement", "job_ranks", "mpi_size"]


@dataclass(frozen=True)
class JobRanks:
    """The ranks of one command: ``total`` in the job, ``per_node`` on each node (on this host, as this host's
    agent starts them), ``here`` started by this process (``None``: a launcher started it as one of them)."""

    total: int
    per_node: int
    here: int | None
    launcher: str | None
    """``torchrun``, ``slurm`` or ``mpi`` where one started this process; ``None``: parplan starts the ranks."""
    nodes: Nodes | None = None
    """``runtime.launch.Nodes`` where this host is one of ``--nnodes``."""

    def threads(self, given: int | None) -> int:
        """CPU threads per rank: ``given`` (``--threads``), else this host's cores over the ranks on it."""
        return given or max(1, (os.cpu_count() or 1) // self.per_node)

    @property
    def spans_nodes(self) -> bool:
        """Whether the job's ranks are on more than one node."""
        return self.per_node < self.total


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    """``--nnodes``, ``--node-rank``, ``--rdzv-endpoint`` and ``--rdzv-id``: torchrun's names and meaning."""
    group = parser.add_argument_group("several hosts (one agent per host, as torchrun)")
    group.add_argument("--nnodes", type=positive_int, metavar="N",
                       help="this host starts --nproc ranks of a job of N hosts, each running this command")
    group.add_argument("--node-rank", type=non_negative_int, metavar="K",
                       help="this host's number, 0 … N−1 (a static rendezvous at --rdzv-endpoint, which node 0 "
                            "hosts); default: numbered as the hosts arrive (c10d)")
    group.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="where the hosts meet (with --nnodes)")
    group.add_argument("--rdzv-id", default="parplan", metavar="ID",
                       help="the job's id, the same on every host (default parplan)")


def job_ranks(args: argparse.Namespace, planned: int | None, *,
              missing: str = "--layout needs --nproc R (how many ranks to start)") -> JobRanks:
    """The command's ranks from ``--nproc``, ``--nnodes`` or the launcher; ``planned``: the plan's devices;
    ``missing``: the refusal where neither gives a count."""
    launcher = launcher_of()
    if launcher is not None:
        if getattr(args, "nnodes", None):
            raise InputError(f"--nnodes is for parplan starting the ranks itself; {launcher} started this process "
                             f"as one rank: give the node count to {launcher}")
        total, per_node = _launched(launcher)
        if args.nproc is not None and args.nproc != total:
            raise InputError(f"--nproc {args.nproc} but {launcher} started {total} ranks; drop --nproc or make them "
                             "equal")
        return JobRanks(total, per_node, None, launcher)
    hosts = getattr(args, "nnodes", None) or 1
    if args.nproc is None and planned is not None and planned % hosts:
        raise InputError(f"the plan's {planned} devices do not divide into --nnodes {hosts} hosts; give --nproc R "
                         "(ranks per host)")
    here = args.nproc or (planned // hosts if planned is not None else None)
    if here is None:
        raise InputError(missing)
    return JobRanks(here * hosts, here, here, None, _nodes(args, hosts))


def check_placement(plan: Plan, ranks: JobRanks, what: str) -> None:
    """Refuse a job across nodes whose ranks per node are not the plan's (``Cluster.node_of``: ranks fill nodes
    in order, as torchrun and Slurm number them). On one node any plan runs (its links are all local)."""
    if not ranks.spans_nodes:
        return
    planned = min(plan.cluster.devices_per_node, ranks.total)
    if planned != ranks.per_node:
        raise InputError(f"{what} was made for nodes of {plan.cluster.devices_per_node} devices but this job runs "
                         f"{ranks.per_node} ranks on each of its nodes, so ranks the plan put on one node would talk "
                         f"across nodes; plan again with --devices-per-node {ranks.per_node}, or start "
                         f"{planned} ranks per node")


def mpi_size() -> int:
    """Ranks of the MPI job this process belongs to."""
    from mpi4py import MPI

    return int(MPI.COMM_WORLD.Get_size())


def _launched(launcher: str) -> tuple[int, int]:
    """``(world size, ranks per node)`` of the job a launcher started."""
    if launcher == "mpi":
        total = mpi_size()
        local = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") or os.environ.get("MPI_LOCALNRANKS")
        return total, int(local) if local and local.isdigit() else total
    place = place_in_job()
    assert place is not None
    return place.world_size, place.local_world_size


def _nodes(args: argparse.Namespace, hosts: int) -> Nodes | None:
    from runtime.launch import Nodes

    if hosts == 1:
        if getattr(args, "node_rank", None) is not None or getattr(args, "rdzv_endpoint", None):
            raise InputError("--node-rank and --rdzv-endpoint are for a job of several hosts; add --nnodes N")
        return None
    endpoint = args.rdzv_endpoint
    host, _, port = (endpoint or "").rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"--nnodes {hosts} needs --rdzv-endpoint HOST:PORT (where the hosts meet), got {endpoint!r}")
    if args.node_rank is not None and args.node_rank >= hosts:
        raise InputError(f"--node-rank {args.node_rank} but --nnodes {hosts}: number the hosts 0 … {hosts - 1}")
    return Nodes(hosts, endpoint, args.node_rank, args.rdzv_id)

