"""A lower bound on the seconds a pipeline stage takes to send its activations to the next, per cut and stage size.

A stale pipeline moves at least at its slowest link's pace (``cost_models.pipeline_cost``), so the stage search
(``planner.stages``) skips a stale configuration whose cuts cannot beat the best plan once each stage counts
this floor. The floor is ``cost_models.estimate``'s transfer with every tensor crossing the cut split over all
the stage's devices (a layout uses at most them), between nodes where the stage fills whole nodes (the next
one then starts on another), else over the faster link.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from cost_models.cluster import Cluster
from cost_models.estimate import crossing_bytes, transfer_s
from cost_models.profile import Profile

if TYPE_CHECKING:
    from cost_models.graph import LayerGraph

__all__ = ["send_floor"]


def send_floor(graph: LayerGraph, groups: Mapping[str, tuple[str, ...]], heads: Sequence[str], profile: Profile,
               cluster: Cluster, cache: dict[tuple[Any, ...], Any]) -> Callable[[int, int], float]:
    """``(j, size) →`` the floor (module docstring) of a stage ending before decision ``j`` (of ``heads``, in
    order) on ``size`` devices; 0 after the last. ``cache``: the floors of every cut per graph and size, kept
    across calls."""
    def floor(j: int, size: int) -> float:
        key = ("sends", id(graph), size)
        if key not in cache:
            levels = ("inter",) if size >= cluster.devices_per_node else ("intra", "inter")
            cache[key] = [min(transfer_s(profile, level, nbytes) for level in levels)
                          for nbytes in _crossing_bytes(graph, groups, heads, size)]
        return cache[key][j]
    return floor


def _crossing_bytes(graph: LayerGraph, groups: Mapping[str, tuple[str, ...]], heads: Sequence[str],
                    size: int) -> list[int]:
    """Per decision ``j`` (and after the last): the bytes one of ``size`` ranks sends across a cut before ``j``
    (``cost_models.estimate``'s boundary: each edge from a stage to a later one); none after the last."""
    position = {layer: index for index, head in enumerate(heads) for layer in groups[head]}
    change = [0] * (len(heads) + 2)
    dtype = graph.graph["dtype"]
    for source, target in graph.edges:
        if source in position and target in position and position[source] < position[target]:
            nbytes = crossing_bytes(graph.nodes[source], size, dtype)
            change[position[source] + 1] += nbytes  # crossed by the cuts before decisions source+1 … target
            change[position[target] + 1] -= nbytes
    found, running = [], 0
    for j in range(len(heads) + 1):
        running += change[j]
        found.append(running if j < len(heads) else 0)
    return found
