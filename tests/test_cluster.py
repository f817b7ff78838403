"""Tier 1: the Cluster value type (no torch)."""

from __future__ import annotations

import pytest

from cost_models.cluster import Cluster, Link
from cost_models.errors import InputError

NVLINK = Link(latency_s=2e-6, bandwidth_bps=150e9)
IB = Link(latency_s=5e-6, bandwidth_bps=25e9)


def test_nodes_and_links() -> None:
    cluster = Cluster(devices=16, devices_per_node=4, memory_bytes=16 * 2**30, intra=NVLINK, inter=IB)
    assert cluster.nodes == 4
    assert cluster.node_of(5) == 1
    assert cluster.link(4, 7) is NVLINK
    assert cluster.link(3, 4) is IB
    assert cluster.spans_nodes(range(0, 4)) is False
    assert cluster.spans_nodes([0, 4]) is True
    assert NVLINK.transfer_s(150e9) == pytest.approx(1.0 + 2e-6)


def test_partial_node_is_allowed() -> None:
    assert Cluster(devices=2, devices_per_node=8, memory_bytes=1, intra=NVLINK, inter=IB).nodes == 1


def test_round_trip() -> None:
    cluster = Cluster(devices=8, devices_per_node=4, memory_bytes=2**34, intra=NVLINK, inter=IB, name="v100x8")
    assert Cluster.from_dict(cluster.to_dict()) == cluster


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"devices": 0}, "Cluster.devices must be a positive integer"),
        ({"devices": 6}, "whole nodes of 4"),
        ({"memory_bytes": -1}, "Cluster.memory_bytes"),
        ({"devices_per_node": 2.5}, "Cluster.devices_per_node"),
    ],
)
def test_refuses_bad_values(kwargs: dict, message: str) -> None:
    base = {"devices": 8, "devices_per_node": 4, "memory_bytes": 2**30, "intra": NVLINK, "inter": IB}
    with pytest.raises(InputError, match=message):
        Cluster(**{**base, **kwargs})


@pytest.mark.parametrize(("latency", "bandwidth"), [(-1.0, 1e9), (0.0, 0.0), (float("nan"), 1e9), (0.0, "fast")])
def test_link_refuses_bad_values(latency: object, bandwidth: object) -> None:
    with pytest.raises(InputError, match="Link"):
        Link(latency_s=latency, bandwidth_bps=bandwidth)  # type: ignore[arg-type]
