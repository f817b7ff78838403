"""How many devices a pipeline stage may take, and how many micro-batches a ``sync`` pipeline may cut its batch
into (``planner.pipeline.stages`` searches every configuration these allow)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from math import prod
from typing import TYPE_CHECKING

from cost_models.cluster import Cluster
from planner.layout_space import splits_exactly

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["budgets", "micro_batch_counts", "sizes_for", "stage_counts", "stage_sizes"]


def budgets(devices: int, devices_per_node: int) -> list[int]:
    """The device budgets a pipeline may use on ``devices`` devices, largest first: ``devices`` and its halves,
    down to 2 devices, each whole nodes or part of one (the rest of the devices idle). Past some size a small
    batch split finer costs more in halos, redistribution and allreduce than it saves in compute, and the fastest
    plan leaves devices idle (ResNet-50 at 64×2048² on h100s: the 16,384-device plan beats every plan of 65,536);
    budgets too small for the model's work cost nothing to rule out (``planner.pipeline.bounds``)."""
    found = [devices]
    while found[-1] % 2 == 0 and found[-1] // 2 >= 2:
        half = found[-1] // 2
        if half % devices_per_node and devices_per_node % half:
            break
        found.append(half)
    return found


def stage_counts(devices: int, devices_per_node: int, max_stages: int) -> list[int]:
    """Stage counts ``2..max_stages`` that split ``devices`` into equal stages of whole nodes (or of one node)."""
    counts = []
    for stages in range(2, max_stages + 1):
        per_stage, rest = divmod(devices, stages)
        if rest == 0 and (per_stage % devices_per_node == 0 or devices_per_node % per_stage == 0):
            counts.append(stages)
    return counts


def micro_batch_counts(batch: int, stages: int) -> list[int]:
    """The micro-batch counts a ``sync`` pipeline of ``stages`` stages may take, from ``stages`` up (or the batch,
    if smaller): the divisors of ``batch``; ``stages`` itself where the least divisor's micro-batches are under
    half of its; and, where the micro-batch sizes these give lie more than a factor of 2 apart, the count that
    halves the larger (micro-batches then differ by one sample: ``cost_models.ir.micro_batches``) — so that every
    size of micro-batch is within a factor of 2 of one searched, and a batch with few divisors is not left
    with micro-batches of one sample only.

    Fewer micro-batches than stages are left out: the first stage would hold the whole batch's activations, as
    it does with ``M = K``, and every stage would idle for ``K − M`` of the ``K + M − 1`` steps.
    """
    least = min(stages, batch)
    counts = {count for count in range(least, batch + 1) if batch % count == 0}
    if 2 * -(-batch // min(counts)) < -(-batch // least):  # the divisors' largest micro-batch: under half K's
        counts.add(least)
    while True:
        sizes = sorted({-(-batch // count) for count in counts}, reverse=True)
        gaps = [large for large, small in zip(sizes, sizes[1:]) if large > 2 * small]
        halving = [-(-batch // -(-large // 2)) for large in gaps]  # the fewest micro-batches of ≤ ⌈large/2⌉ samples
        new = [count for count in halving if count not in counts]
        if not new:
            return sorted(counts)
        counts.add(new[0])


def stage_sizes(cluster: Cluster, graph: LayerGraph) -> list[int]:
    """The device counts a stage may take: those of equal stages of whole nodes (or of equal parts of one node),
    and any other number of whole nodes (a 5-smooth number of them: 24, 40, 48 … nodes), part of a node, or —
    on a cluster of one node — of its devices, over which the model's largest activation splits exactly (a
    count only idle devices would fill is left out)."""
    largest = _largest_output(graph)
    return list(_sizes(cluster.devices, cluster.devices_per_node, None if largest is None else tuple(largest)))


@lru_cache(maxsize=256)
def _sizes(devices: int, node: int, largest: tuple[int, ...] | None) -> tuple[int, ...]:
    """:func:`stage_sizes` of ``devices`` devices, ``node`` to a node, for a largest activation of shape
    ``largest`` (made once: a search and its helper both ask)."""
    equal = {devices // count for count in stage_counts(devices, node, devices)}
    if devices <= node:
        others = set(range(1, devices))
    else:
        others = {node * count for count in _smooth(devices // node)} | {d for d in range(1, node) if node % d == 0}
    filled = {size for size in others - equal if size < devices and largest is not None
              and splits_exactly(largest, size, min(node, size))}
    return tuple(sorted(equal | filled, reverse=True))


def _smooth(most: int) -> list[int]:
    """The numbers 1 … ``most`` with no prime factor above 5."""
    found = []
    for number in range(1, most + 1):
        rest = number
        for prime in (2, 3, 5):
            while rest % prime == 0:
                rest //= prime
        if rest == 1:
            found.append(number)
    return found


def _largest_output(graph: LayerGraph) -> list[int] | None:
    """The shape of the largest single output tensor of ``graph``'s layers (the first of the largest)."""
    shapes = [data.output_shape for _, data in graph.nodes(data=True)
              if data.output_shape and not isinstance(data.output_shape[0], list)]
    return max(shapes, key=prod, default=None)


def sizes_for(stages: int, devices: int, sizes: Sequence[int]) -> tuple[int, ...]:
    """The device counts the stages of a ``stages``-stage pipeline may take: the equal-stage sizes nearest
    ``devices / stages`` from below and above (one if it is one of them); none if ``stages`` of the least exceed
    the devices. The cuts choose each stage's among them, within the devices (some may stay idle)."""
    below = [size for size in sizes if size * stages <= devices]
    above = [size for size in sizes if size * stages >= devices]
    if not below:
        return ()
    return tuple(sorted({max(below), *(min(above),) * bool(above)}))
