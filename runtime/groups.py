"""The process groups a plan needs, created once and in the same order on every rank.

Members of a stage are numbered ``0 … G−1`` (global ranks ``ranks[q]``). Under
a Layout ``L`` member ``q`` has grid coordinates ``coordinates(L, q)`` and
replica index ``q // L.ranks``. A group is a block of members that agree on
some of these (:func:`blocks`):

* ``"spatial"``: same replica, sample and channel part — the tiles of one
  image (halo neighbours, spatial batch-norm, global pooling);
* ``"samples"``: same replica and channel part — the ranks whose tiles make up
  the whole batch (synchronised batch-norm);
* ``"image"``: same replica and sample part — the ranks holding every channel
  and tile of the same samples (group-norm split by channel);
* ``"slice"``: same channel part — every rank holding the same slice of a
  layer's weights (their gradients are summed over it);
* ``"channels"``: same replica, sample part and tile — the ranks holding
  every channel part of the same box (a row-form linear layer's partial
  sums, ``cost_models.dense_forms``).

``torch.distributed.new_group`` must be entered by every rank of the default
group for every group, in the same order, so :class:`GroupCache` creates all
of them at once from the sorted set of blocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import timedelta

import torch.distributed as dist

from cost_models.layout import Layout
from cost_models.redistribution import coordinates
from runtime.waiting import exchange

__all__ = ["GroupCache", "block_of", "blocks", "gradient_group_ranks", "group_ranks", "this_rank",
           "world_size"]

_KINDS = ("spatial", "samples", "slice", "image", "channels")
_KEYS = {"spatial": (True, True, True, False), "samples": (True, False, True, False),
         "slice": (False, False, True, False), "image": (True, True, False, False),
         "channels": (True, True, False, True)}  # the same replica, sample part, channel part, tile


def blocks(layout: Layout, size: int, kind: str) -> list[tuple[int, ...]]:
    """The partition of members ``0 … size−1`` into groups of ``kind`` (one of ``_KINDS``)."""
    replica, sample, channel, tile = _KEYS[kind]
    found: dict[tuple[int, int, int, tuple[int, ...]], list[int]] = {}
    for member in range(size):
        n, c, *spatial = coordinates(layout, member)
        key = (member // layout.ranks if replica else -1, n if sample else -1, c if channel else -1,
               tuple(spatial) if tile else ())
        found.setdefault(key, []).append(member)
    return [tuple(members) for members in found.values()]


def block_of(layout: Layout, size: int, kind: str, member: int) -> tuple[int, ...]:
    """The members of ``member``'s group of ``kind``."""
    return next(block for block in blocks(layout, size, kind) if member in block)


class GroupCache:
    """Process groups by their tuple of global ranks; build every group first, on every rank.

    ``timeout``: how long an operation of these groups may wait for a peer (``parplan run --timeout-s``);
    ``None`` is torch's default for the backend. The default group's own is set by ``init_process_group``.
    """

    def __init__(self, world: Sequence[int], timeout: timedelta | None = None) -> None:
        self.world = tuple(world)
        self.timeout = timeout
        self._groups: dict[tuple[int, ...], dist.ProcessGroup | int] = {}
        self._gradient_groups: dict[tuple[int, ...], dist.ProcessGroup | int] = {}
        """Both by their ranks; an ``int`` (``GroupMember.NON_GROUP_MEMBER``) where this rank is not one of them."""

    def build(self, rank_tuples: Iterable[tuple[int, ...]]) -> None:
        """Create the groups of ``rank_tuples`` not made yet (collective: every rank passes the same set)."""
        for ranks in sorted(set(rank_tuples) - set(self._groups)):
            if len(ranks) > 1 and ranks != self.world:
                with exchange("creating the plan's process groups", ranks):
                    self._groups[ranks] = dist.new_group(list(ranks), timeout=self.timeout)

    def build_gradients(self, rank_tuples: Iterable[tuple[int, ...]]) -> None:
        """Create a group of their own for the gradient sums of ``rank_tuples`` (collective, as :meth:`build`).

        Gradient buckets are summed asynchronously while backward runs on (``runtime.gradsync``); on groups of
        their own, their order never interleaves with the halo and norm collectives of the same ranks.
        """
        for ranks in sorted(set(rank_tuples) - set(self._gradient_groups)):
            if len(ranks) > 1:
                with exchange("creating the plan's gradient process groups", ranks):
                    self._gradient_groups[ranks] = dist.new_group(list(ranks), timeout=self.timeout)

    def gradient_group(self, ranks: tuple[int, ...]) -> dist.ProcessGroup:
        """The group the gradients of ``ranks`` (this rank one of them) are summed over (:meth:`build_gradients`)."""
        if ranks not in self._gradient_groups:
            raise KeyError(f"no gradient process group for ranks {list(ranks)} was built; "
                           f"build_gradients() must list every replica group")
        return _member_group(self._gradient_groups[ranks], ranks)

    def get(self, ranks: tuple[int, ...]) -> dist.ProcessGroup | None:
        """The group of ``ranks`` (``None`` for a single rank; the default group for the whole world)."""
        if len(ranks) == 1:
            return None
        if ranks == self.world:
            return dist.group.WORLD
        if ranks not in self._groups:
            raise KeyError(f"no process group for ranks {list(ranks)} was built; build() must list every group")
        return _member_group(self._groups[ranks], ranks)


def _member_group(group: dist.ProcessGroup | int, ranks: tuple[int, ...]) -> dist.ProcessGroup:
    assert not isinstance(group, int), f"this rank is not one of the group's ranks {list(ranks)}"
    return group


def group_ranks(layouts: Iterable[Layout], ranks: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """The global ranks of every group that layers of ``layouts`` on ``ranks`` use (``runtime.groups``)."""
    for layout in sorted(set(layouts)):
        for kind in _KINDS:
            for members in blocks(layout, len(ranks), kind):
                yield tuple(ranks[q] for q in members)
    yield ranks


def gradient_group_ranks(layouts: Iterable[Layout], ranks: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """The global ranks of every group whose gradients layers of ``layouts`` on ``ranks`` may sum: the ranks
    holding each slice of a channel-split weight, and all of ``ranks`` (``runtime.slicing``)."""
    for layout in sorted(set(layouts)):
        for members in blocks(layout, len(ranks), "slice"):
            yield tuple(ranks[q] for q in members)
    yield ranks


def world_size() -> int:
    """The processes of the default group (1 without one)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def this_rank() -> int:
    """This process's rank in the default group (0 without one)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
