"""Seconds of the communication a plan implies: gradient allreduce, halo exchange, redistribution.

All three read the α-β fits of a :class:`~cost_models.profile.Profile` and
choose the link level from the :class:`~cost_models.cluster.Cluster` the ranks
live on.

Assumptions:
    * Ranks fill nodes in order (``Cluster.node_of``).
    * An allreduce whose group stays in one node is a ring on the intra link.
      One spanning nodes is hierarchical: reduce-scatter inside each node,
      allreduce of each node's shard between nodes (``1/g_local`` of the
      bytes, over ``nodes`` ranks), allgather inside each node — as NCCL's
      tree/ring hierarchy and Horovod's hierarchical allreduce do.
    * Halo and redistribution messages of one rank go out one after another
      (one link at a time), so a rank's time is the sum of its messages; the
      step takes as long as its busiest rank.
"""

from __future__ import annotations

from typing import Sequence

from cost_models.cluster import Cluster
from cost_models.halo import HaloMessage
from cost_models.layout import Layout
from cost_models.profile import Profile
from cost_models.redistribution import redistribution

__all__ = ["allreduce_s", "halo_exchange_s", "redistribution_s"]


def allreduce_s(profile: Profile, cluster: Cluster, ranks: Sequence[int], nbytes: float) -> float:
    """Seconds to allreduce ``nbytes`` held by each of ``ranks``."""
    group = len(ranks)
    if group <= 1 or nbytes <= 0:
        return 0.0
    per_node: dict[int, int] = {}
    for rank in ranks:
        per_node[cluster.node_of(rank)] = per_node.get(cluster.node_of(rank), 0) + 1
    if len(per_node) == 1:
        return profile.comm_time_s("allreduce", "intra", group, nbytes)
    local = max(per_node.values())
    inside = (profile.comm_time_s("reduce_scatter", "intra", local, nbytes)
              + profile.comm_time_s("allgather", "intra", local, nbytes))
    return inside + profile.comm_time_s("allreduce", "inter", len(per_node), nbytes / local)


def halo_exchange_s(profile: Profile, messages: Sequence[HaloMessage], level: str) -> float:
    """Seconds for one tile to receive its halo ``messages`` (and, backward, return their gradients)."""
    return sum(profile.comm_time_s("sendrecv", level, 2, message.nbytes) for message in messages)


def redistribution_s(profile: Profile, cluster: Cluster, shape: Sequence[int], itemsize: int,
                     source: Layout, target: Layout, devices: int) -> float:
    """Seconds of the busiest rank when a tensor of ``shape`` moves from ``source`` to ``target``."""
    worst = 0.0
    for transfer in redistribution(shape, source, target, devices):
        if not transfer.peers:
            continue
        level = "inter" if cluster.spans_nodes([transfer.rank, *transfer.peers]) else "intra"
        fit_alpha = profile.comm_time_s("sendrecv", level, 2, 0)
        total = profile.comm_time_s("sendrecv", level, 2, transfer.elements * itemsize)
        worst = max(worst, total + fit_alpha * (len(transfer.peers) - 1))
    return worst
