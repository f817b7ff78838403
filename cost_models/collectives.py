"""α-β cost terms of the collectives parplan uses (ring and pairwise algorithms).

A collective over a group of ``p`` ranks moving ``n`` bytes costs
``latency_count · α + volume_bytes · β`` where ``α`` is the per-message latency
and ``β`` the seconds per byte of one link. The two factors per collective:

=================  ===============  ========================  =========================================
collective         latency_count    volume_bytes              ``n`` is
=================  ===============  ========================  =========================================
``allreduce``      ``2(p−1)``       ``2(p−1)/p · n``          the buffer each rank holds (ring)
``allgather``      ``p−1``          ``(p−1)/p · n``           the gathered output on each rank (ring)
``reduce_scatter`` ``p−1``          ``(p−1)/p · n``           the full input on each rank (ring)
``all_to_all``     ``p−1``          ``(p−1)/p · n``           each rank's send buffer (pairwise)
``sendrecv``       ``1``            ``n``                     one message, sent and received at once
=================  ===============  ========================  =========================================

Assumptions: links are full duplex and every rank drives one link at a time;
a group of one rank costs nothing. These are the formulas of BACKGROUND.md
and of Thakur, Rabenseifner & Gropp (2005) for the bandwidth-optimal
algorithms gloo and NCCL use at large sizes.
"""

from __future__ import annotations

from cost_models.errors import InputError

__all__ = ["COLLECTIVES", "comm_terms"]

COLLECTIVES: tuple[str, ...] = ("allreduce", "allgather", "reduce_scatter", "all_to_all", "sendrecv")


def comm_terms(collective: str, group: int, nbytes: float) -> tuple[float, float]:
    """``(latency_count, volume_bytes)`` of one collective; time is ``count·α + volume·β``.

    Args:
        collective: One of :data:`COLLECTIVES`.
        group: Number of ranks taking part (>= 1).
        nbytes: Bytes as defined per collective in the module docstring.
    """
    if group < 1 or nbytes < 0:
        raise InputError(f"a collective needs group >= 1 and bytes >= 0, got group={group}, bytes={nbytes}")
    if group == 1:
        return 0.0, 0.0
    p = float(group)
    if collective == "allreduce":
        return 2 * (p - 1), 2 * (p - 1) / p * nbytes
    if collective in ("allgather", "reduce_scatter", "all_to_all"):
        return p - 1, (p - 1) / p * nbytes
    if collective == "sendrecv":
        return 1.0, float(nbytes)
    raise InputError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
