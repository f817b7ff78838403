"""The machines a plan is made for: devices, nodes, memory and two link levels.

Assumptions:
    * Devices are identical; ``devices_per_node`` of them share a node.
    * Two devices on the same node talk over the ``intra`` link, others over
      ``inter``; each link is an α-β channel: a message of ``b`` bytes takes
      ``latency_s + b / bandwidth_bps``.
    * When ``devices`` is not larger than ``devices_per_node`` the cluster is
      one node, which may be partly used.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from cost_models.errors import InputError

__all__ = ["Cluster", "Link", "stage_cluster"]


@dataclass(frozen=True)
class Link:
    """An α-β link: ``latency_s`` per message and ``bandwidth_bps`` bytes per second."""

    latency_s: float
    bandwidth_bps: float

    def __post_init__(self) -> None:
        if not _is_number(self.latency_s) or self.latency_s < 0:
            raise InputError(f"Link.latency_s must be a number >= 0, got {self.latency_s!r}")
        if not _is_number(self.bandwidth_bps) or self.bandwidth_bps <= 0:
            raise InputError(f"Link.bandwidth_bps must be a number > 0, got {self.bandwidth_bps!r}")

    def transfer_s(self, nbytes: float) -> float:
        """Time to send one message of ``nbytes`` over this link."""
        return self.latency_s + nbytes / self.bandwidth_bps

    def short(self) -> str:
        """Human form, e.g. ``5µs/25GB/s``."""
        return f"{self.latency_s * 1e6:g}µs/{self.bandwidth_bps / 1e9:g}GB/s"


@dataclass(frozen=True)
class Cluster:
    """Devices, their grouping into nodes, memory per device and the two link levels."""

    devices: int
    devices_per_node: int
    memory_bytes: int
    intra: Link
    inter: Link
    name: str = ""

    def __post_init__(self) -> None:
        for field in ("devices", "devices_per_node", "memory_bytes"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"Cluster.{field} must be a positive integer, got {value!r}")
        if self.devices > self.devices_per_node and self.devices % self.devices_per_node:
            raise InputError(
                f"Cluster of {self.devices} devices cannot be made of whole nodes of {self.devices_per_node}; "
                f"use a multiple of {self.devices_per_node} devices"
            )
        object.__setattr__(self, "_hash", hash((self.devices, self.devices_per_node, self.memory_bytes, self.intra,
                                                self.inter, self.name)))  # keys of every cost memo

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    @property
    def nodes(self) -> int:
        """Number of nodes the devices occupy."""
        return -(-self.devices // self.devices_per_node)

    def node_of(self, rank: int) -> int:
        """The node that holds device ``rank`` (ranks fill nodes in order)."""
        if not 0 <= rank < self.devices:
            raise InputError(f"rank {rank} is outside this cluster of {self.devices} devices")
        return rank // self.devices_per_node

    def link(self, rank_a: int, rank_b: int) -> Link:
        """The link two devices talk over."""
        return self.intra if self.node_of(rank_a) == self.node_of(rank_b) else self.inter

    def spans_nodes(self, ranks: range | list[int] | tuple[int, ...]) -> bool:
        """Whether a group of ranks lives on more than one node."""
        if not ranks:
            return False
        return self.node_of(min(ranks)) != self.node_of(max(ranks))  # nodes hold consecutive ranks

    def to_dict(self) -> dict[str, object]:
        """JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cluster:
        """Inverse of :meth:`to_dict`."""
        return cls(
            devices=data["devices"],
            devices_per_node=data["devices_per_node"],
            memory_bytes=data["memory_bytes"],
            intra=Link(**data["intra"]),
            inter=Link(**data["inter"]),
            name=data.get("name", ""),
        )

    def short(self) -> str:
        """Human form, e.g. ``8×(4/node, 16GiB)``."""
        return f"{self.devices}×({self.devices_per_node}/node, {self.memory_bytes / 2**30:g}GiB)"


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def stage_cluster(cluster: Cluster, devices: int) -> Cluster:
    """The cluster of one pipeline stage of ``devices`` of ``cluster``'s devices (whole nodes, or part of one).

    Raises:
        InputError: ``devices`` are more than one node but not whole nodes.
    """
    return replace(cluster, devices=devices, devices_per_node=min(cluster.devices_per_node, devices))
