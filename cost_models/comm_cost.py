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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain
from math import lcm

import numpy as np

from cost_models.cluster import Cluster
from cost_models.errors import InputError
from cost_models.halo import HaloMessage
from cost_models.layout import Layout, as_volume
from cost_models.profile import Profile
from cost_models.redistribution import rank_loads

GRADIENT_BUCKET_BYTES = 25 * 2**20
"""Bytes of weight gradients one allreduce carries (DDP's default ``bucket_cap_mb=25``)."""

__all__ = ["GRADIENT_BUCKET_BYTES", "MovePattern", "PATTERN_CASES", "allgather_s", "allreduce_s", "halo_exchange_s",
           "move_pattern_arrays", "move_patterns", "nested", "nested_mask", "node_shape", "shaped_allreduce_s",
           "gradient_allreduce_s", "pattern_s", "patterned_s", "redistribution_row_s", "redistribution_s",
           "sendrecv_coefficients"]


def allreduce_s(profile: Profile, cluster: Cluster, ranks: Sequence[int], nbytes: float) -> float:
    """Seconds to allreduce ``nbytes`` held by each of ``ranks``."""
    if len(ranks) <= 1 or nbytes <= 0:
        return 0.0
    return shaped_allreduce_s(profile, len(ranks), *_node_shape(cluster, tuple(ranks)), nbytes)


def shaped_allreduce_s(profile: Profile, group: int, nodes: int, local: int, nbytes: float) -> float:
    """:func:`allreduce_s` over ``group`` ranks on ``nodes`` nodes, at most ``local`` of them on one
    (``node_shape``)."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    if nodes == 1:
        return profile.comm_time_s("allreduce", "intra", group, nbytes)
    inside = (profile.comm_time_s("reduce_scatter", "intra", local, nbytes)
              + profile.comm_time_s("allgather", "intra", local, nbytes))
    return inside + profile.comm_time_s("allreduce", "inter", nodes, nbytes / local)


def allgather_s(profile: Profile, cluster: Cluster, ranks: Sequence[int], nbytes: float) -> float:
    """Seconds to allgather ``nbytes`` (the gathered tensor each of ``ranks`` ends with): a ring on the intra link
    inside one node, on the inter link across nodes (its slowest hop)."""
    if len(ranks) <= 1 or nbytes <= 0:
        return 0.0
    nodes, _ = _node_shape(cluster, tuple(ranks))
    return profile.comm_time_s("allgather", "intra" if nodes == 1 else "inter", len(ranks), nbytes)


def gradient_allreduce_s(profile: Profile, cluster: Cluster, ranks: Sequence[int], nbytes: float) -> float:
    """Seconds of ``nbytes`` of weight gradients in the bucketed allreduce over ``ranks``: ``t(B)·nbytes/B``."""
    if len(ranks) <= 1 or nbytes <= 0:
        return 0.0
    return allreduce_s(profile, cluster, ranks, GRADIENT_BUCKET_BYTES) * nbytes / GRADIENT_BUCKET_BYTES


def node_shape(cluster: Cluster, ranks: Sequence[int]) -> tuple[int, int]:
    """How many nodes a group of ``ranks`` spans and the most of its ranks on one node."""
    return _node_shape(cluster, tuple(ranks))


@lru_cache(maxsize=8192)
def _node_shape(cluster: Cluster, ranks: tuple[int, ...]) -> tuple[int, int]:
    """How many nodes a group spans and the most of its ranks on one node."""
    per_node: dict[int, int] = {}
    for rank in ranks:
        node = cluster.node_of(rank)
        per_node[node] = per_node.get(node, 0) + 1
    return len(per_node), max(per_node.values())


def halo_exchange_s(profile: Profile, messages: Sequence[HaloMessage], level: str) -> float:
    """Seconds for one tile to receive its halo ``messages`` (and, backward, return their gradients)."""
    return sum(profile.comm_time_s("sendrecv", level, 2, message.nbytes) for message in messages)


def redistribution_s(profile: Profile, cluster: Cluster, shape: Sequence[int], itemsize: int,
                     source: Layout, target: Layout, devices: int) -> float:
    """Seconds of the busiest rank when a tensor of ``shape`` moves from ``source`` to ``target``."""
    return redistribution_row_s(profile, cluster, shape, itemsize, source, [target], devices)[0]


def redistribution_row_s(profile: Profile, cluster: Cluster, shape: Sequence[int], itemsize: int,
                         source: Layout, targets: Sequence[Layout], devices: int) -> list[float]:
    """:func:`redistribution_s` from one ``source`` to each of ``targets``, computed together."""
    if devices > cluster.devices:
        raise InputError(f"a redistribution over {devices} ranks needs that many devices; the cluster has "
                         f"{cluster.devices}")
    loads = rank_loads(shape, source, targets, devices)
    per_node = cluster.devices_per_node
    spans = loads.lowest // per_node != loads.highest // per_node
    worst = np.zeros(len(targets))
    for level, on_level in (("intra", ~spans), ("inter", spans)):
        busy = on_level & (loads.peers > 0)
        if not busy.any():
            continue
        # α-β fits are affine in bytes: a rank's seconds are α·peers + β·bytes, maximised over the ranks at once
        alpha_s = profile.comm_time_s("sendrecv", level, 2, 0)
        beta_s = profile.comm_time_s("sendrecv", level, 2, itemsize) - alpha_s
        seconds = np.where(busy, alpha_s * loads.peers + beta_s * loads.elements.astype(np.float64), 0.0)
        worst = np.maximum(worst, seconds.max(axis=1))
    return worst.tolist()


@dataclass(frozen=True)
class MovePattern:
    """The part of a redistribution that does not depend on the tensor's extents.

    Between two layouts whose splits nest (along every dimension one part
    count divides the other) and divide the tensor exactly, every rank's
    wanted box overlaps the same number of source parts (``parts``); a rank
    either holds one of them itself or not, and its peers are on its node or
    not. ``cases`` lists the ``(holds own part, spans nodes)`` pairs that occur.
    """

    parts: int
    cases: tuple[tuple[bool, bool], ...]


PATTERN_CASES: tuple[tuple[bool, bool], ...] = ((False, False), (False, True), (True, False), (True, True))
"""The ``(holds own part, spans nodes)`` pairs a :class:`MovePattern` may contain, in a fixed order."""


def nested(source: Layout, target: Layout, shape: Sequence[int]) -> bool:
    """Whether :func:`move_patterns` applies: nesting splits that divide ``shape`` exactly."""
    return bool(nested_mask(np.array(as_volume(shape)), np.array(source.parts()), np.array(target.parts())))


def nested_mask(extents: np.ndarray, source_parts: np.ndarray, target_parts: np.ndarray) -> np.ndarray:
    """:func:`nested` for arrays of part counts (last axis ``n, c, d, h, w``), broadcast against each other."""
    divides = (extents % source_parts == 0) & (extents % target_parts == 0)
    return (divides & ((source_parts % target_parts == 0) | (target_parts % source_parts == 0))).all(axis=-1)


def move_patterns(cluster: Cluster, source: Layout, targets: Sequence[Layout], devices: int) -> list[MovePattern]:
    """The :class:`MovePattern` from ``source`` to each of ``targets`` (all nested with it), computed together."""
    parts, present = move_pattern_arrays(cluster, source, targets, devices)
    return [MovePattern(int(parts[index]),
                        tuple(case for case, flags in zip(PATTERN_CASES, present[:, index]) if flags))
            for index in range(len(targets))]


def move_pattern_arrays(cluster: Cluster, source: Layout, targets: Sequence[Layout],
                        devices: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`move_patterns` as arrays: each target's ``parts``, and whether each case of :data:`PATTERN_CASES`
    occurs (``(4, targets)``).

    Closed forms of the nested split (the reference examines every rank's boxes: ``rank_loads``, which
    ``tests/test_comm_cost.py`` checks this against): along a dimension where the target has ``t`` parts and the
    source ``s``, a wanted range covers ``s/t`` source parts from ``b·s/t`` (``s ≥ t``) or lies in part
    ``⌊b·s/t⌋``; a rank holds one of them where its own coordinate falls in that run on every dimension. The
    holders of a rank's parts are a box of its replica block's source grid, row-major, so the lowest and
    highest peer follow from the box's corners (its own part, at a corner, gives way to the next one along the
    innermost dimension the box spans). Ranks repeat with period ``lcm`` of the two layouts' rank counts and the
    node size, so only one period is examined.
    """
    period = lcm(source.ranks, cluster.devices_per_node, *(target.ranks for target in targets))
    if devices % period == 0 and all(_is_power_of_two(p) for p in (period, *source.parts(), *chain.from_iterable(
            target.parts() for target in targets))):
        found = [_bit_pattern(source.parts(), target.parts(), cluster.devices_per_node) for target in targets]
        return (np.array([count for count, _ in found], dtype=np.int64).reshape(-1),
                np.array([cases for _, cases in found], dtype=bool).reshape(-1, 4).T)
    s_parts = np.array(source.parts(), dtype=np.int64)
    t_parts = np.array([target.parts() for target in targets], dtype=np.int64).reshape(-1, 5)
    ranks = np.arange(period if devices % period == 0 else devices, dtype=np.int64)
    runs = np.where(s_parts >= t_parts, s_parts // np.minimum(s_parts, t_parts), 1)  # source parts per wanted range
    first, holds = _wanted_corner(s_parts, t_parts, ranks, source.ranks)
    strides = _strides(s_parts)
    last = first + ((runs - 1) * strides).sum(axis=1)[:, None]
    spanned = runs > 1
    step = np.where(spanned.any(axis=1), strides[4 - np.argmax(spanned[:, ::-1], axis=1)], 0)[:, None]
    own = ranks % source.ranks
    low = np.where(holds & (first == own), first + step, first)
    high = np.where(holds & (last == own), last - step, last)
    count = runs.prod(axis=1)
    talks = (count[:, None] - holds) > 0
    base = ranks - own
    per_node = cluster.devices_per_node
    spans = (np.where(talks, np.minimum(ranks, base + low), ranks) // per_node
             != np.where(talks, np.maximum(ranks, base + high), ranks) // per_node)
    present = np.stack([np.any((holds == held) & (spans == spanning), axis=1) for held, spanning in PATTERN_CASES])
    return count, present


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@lru_cache(maxsize=1 << 16)
def _bit_pattern(s_parts: tuple[int, ...], t_parts: tuple[int, ...], per_node: int) -> tuple[int, tuple[bool, ...]]:
    """One target's ``parts`` and cases of :data:`PATTERN_CASES` where every part count and the node size are
    powers of two: a rank's bits decide everything, so the cases follow from which bits must be equal.

    A rank ``r``'s source coordinates are bit fields of ``r mod S`` (its part, flat), its target coordinates
    bit fields of ``r``. The flat index of the first part it wants takes each non-run bit ``k`` from bit
    ``π(k)`` of ``r`` (run bits, the low ``log(s/t)`` of an axis the box spans, are 0). So a rank holds one of
    its parts iff bit ``k`` of ``r`` equals bit ``π(k)`` for every non-run ``k`` (rank 0 always does); with a
    node of ``2^p`` ranks and ``S ≥ 2^p``, a rank and its box share a node iff the box does not cross a node
    (no run bit at ``p`` or above) and its part's bits from ``p`` up equal the box's (the pairs with
    ``k ≥ p``); with ``S ≤ 2^p`` a replica block lies in one node. Every assignment of bits is a rank of the
    period, so a case occurs iff its equalities can be met and broken as it asks.
    """
    s_log, t_log = [p.bit_length() - 1 for p in s_parts], [p.bit_length() - 1 for p in t_parts]
    node_log = per_node.bit_length() - 1
    image: dict[int, int] = {}  # non-run flat bit -> the bit of r it must equal for the rank to hold its part
    runs_top, count = 0, 1  # one past the highest run bit; parts wanted
    for axis in range(5):
        s, t = s_log[axis], t_log[axis]
        s_at, t_at = sum(s_log[axis + 1:]), sum(t_log[axis + 1:])  # log strides
        if s >= t:
            count <<= s - t
            runs_top = max(runs_top, s_at + s - t if s > t else 0)
            image.update({s_at + s - t + i: t_at + i for i in range(t)})
        else:
            image.update({s_at + i: t_at + t - s + i for i in range(s)})
    breakable = any(k != j for k, j in image.items())
    if sum(s_log) <= node_log:
        return count, (breakable, False, True, False)
    if runs_top > node_log:  # the box crosses a node: every talking rank spans nodes
        return count, (False, breakable, False, count > 1)
    above = [(k, j) for k, j in image.items() if k >= node_log]
    joined = _components(above)
    split = any(k != j and joined.get(k, k) != joined.get(j, j) for k, j in image.items() if k < node_log)
    return count, (split, any(k != j for k, j in above), True, False)


def _components(pairs: Sequence[tuple[int, int]]) -> dict[int, int]:
    """A representative for each bit named in ``pairs``, equal for bits joined by a chain of pairs."""
    parent: dict[int, int] = {}

    def root(bit: int) -> int:
        while parent.setdefault(bit, bit) != bit:
            bit = parent[bit]
        return bit
    for k, j in pairs:
        parent[root(k)] = root(j)
    return {bit: root(bit) for bit in list(parent)}


@lru_cache(maxsize=4096)
def _first_parts(stride: int, parts: int, source_parts: int, ranks: int) -> np.ndarray:
    """Per rank ``0 … ranks − 1``: the first of ``source_parts`` parts its part of ``parts`` (at ``stride``) wants."""
    wanted = (np.arange(ranks, dtype=np.int64) // stride) % parts
    first = wanted * (source_parts // parts) if source_parts >= parts else wanted // (parts // source_parts)
    first.flags.writeable = False
    return first


def _strides(parts: np.ndarray) -> np.ndarray:
    """Row-major strides of grids of ``parts`` (last axis ``n, c, d, h, w``; any leading axes)."""
    after = np.cumprod(parts[..., ::-1], axis=-1)[..., ::-1]  # the product of each axis and those after it
    return np.concatenate([after[..., 1:], np.ones_like(after[..., :1])], axis=-1)


def _wanted_corner(s_parts: np.ndarray, t_parts: np.ndarray, ranks: np.ndarray,
                   source_ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per target and rank: the source grid index of the first part it wants, and whether it holds one.

    A rank's coordinate along an axis of a grid is ``⌊r / stride⌋ mod parts`` (the grid's rank count is a
    multiple of ``stride·parts``), so each axis's contribution depends on the target only through its stride and
    part count there: computed once per distinct pair, then gathered per target.
    """
    s_strides, t_strides = _strides(s_parts), _strides(t_parts)
    own_rank = ranks % source_ranks
    first = np.zeros((len(t_parts), len(ranks)), np.int64)
    holds = np.ones((len(t_parts), len(ranks)), bool)
    for axis in range(5):
        mine = (own_rank // s_strides[axis]) % s_parts[axis]
        codes, which = np.unique(t_strides[:, axis] * (t_parts[:, axis].max() + 1) + t_parts[:, axis],
                                 return_inverse=True)
        keys = np.stack(np.divmod(codes, t_parts[:, axis].max() + 1), axis=1)
        starts = np.stack([_first_parts(int(stride), int(parts), int(s_parts[axis]), len(ranks))
                           for stride, parts in keys])
        run = np.where(s_parts[axis] >= keys[:, 1], s_parts[axis] // np.minimum(keys[:, 1], s_parts[axis]), 1)
        has = (starts <= mine) & (mine < starts + run[:, None])
        which = which.reshape(-1)
        holds &= has[which]
        if s_parts[axis] > 1:
            first += starts[which] * s_strides[axis]
    return first, holds


def sendrecv_coefficients(profile: Profile, itemsize: int) -> dict[bool, tuple[float, float]]:
    """Per link (``True``: between nodes) the α in seconds and the β in seconds per element of one message."""
    found = {}
    for inter, level in ((False, "intra"), (True, "inter")):
        alpha_s = profile.comm_time_s("sendrecv", level, 2, 0)
        found[inter] = (alpha_s, profile.comm_time_s("sendrecv", level, 2, itemsize) - alpha_s)
    return found


def pattern_s(coefficients: Mapping[bool, tuple[float, float]], pattern: MovePattern, shape: Sequence[int],
              source: Layout, target: Layout) -> float:
    """:func:`redistribution_s` of a ``shape`` tensor from its pattern (nested layouts only).

    Args:
        coefficients: :func:`sendrecv_coefficients` of the profile and element size.
    """
    present = np.array([[case in pattern.cases] for case in PATTERN_CASES])
    return float(patterned_s(coefficients, np.array([pattern.parts]), present, np.array(as_volume(shape)),
                             np.array([source.parts()]), np.array([target.parts()]))[0])


def patterned_s(coefficients: Mapping[bool, tuple[float, float]], parts: np.ndarray, present: np.ndarray,
                extents: np.ndarray, source_parts: np.ndarray, target_parts: np.ndarray) -> np.ndarray:
    """:func:`pattern_s` for arrays of moves: their patterns' ``parts`` and ``present`` cases (first axis in
    :data:`PATTERN_CASES` order), and part counts (last axis ``n, c, d, h, w``) broadcast to the moves' shape."""
    wanted = (extents // target_parts).prod(axis=-1).astype(np.float64)
    own = (extents // np.maximum(source_parts, target_parts)).prod(axis=-1).astype(np.float64)
    parts = parts.astype(np.float64)
    worst = np.zeros(np.broadcast(wanted, own, parts).shape)
    for case, (holds, spans) in enumerate(PATTERN_CASES):
        alpha_s, beta_s = coefficients[spans]
        cost = alpha_s * (parts - holds) + beta_s * (wanted - own * holds)
        worst = np.where(present[case] & (parts - holds > 0), np.maximum(worst, cost), worst)
    return worst
