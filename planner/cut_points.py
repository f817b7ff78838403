"""Where a pipeline may be cut: the decision indices at which a stage may start.

A cut must respect the model's traced order (what the runtime cuts) and send
only what the runtime sends between stages: never a layer's tuple of tensors
(``cost_models.capability.crosses_as_tuple``), a value no layer holds (the
trace's ``held_together`` spans), or the two calls of one module with
parameters (``cost_models.capability.shared_modules``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from cost_models.capability import crosses_as_tuple, shared_modules

if TYPE_CHECKING:
    from cost_models.graph import LayerGraph

__all__ = ["allowed_cuts"]


def allowed_cuts(graph: LayerGraph, groups: Mapping[str, tuple[str, ...]]) -> set[int]:
    """Decision indices (into ``groups``, in order) where a stage may start: every layer before precedes every
    layer after in the model's order, and the runtime can send what crosses the cut.

    The runtime cuts the traced program, whose order can differ from the decisions' topological order (a
    residual block's shortcut convolution is traced after the block's main branch).
    """
    position = {layer: index for index, layer in enumerate(graph.compute_layers())}
    spans = [[position[layer] for layer in members] for members in groups.values()]
    before, after = [], []
    largest, smallest = -1, len(position)
    for span in spans:
        largest = max(largest, *span)
        before.append(largest)
    for span in reversed(spans):
        smallest = min(smallest, *span)
        after.append(smallest)
    after.reverse()
    return ({i for i in range(1, len(spans)) if before[i - 1] < after[i]}
            - _tuple_crossings(graph, position, before) - _shared_crossings(graph, position, before)
            - _held_crossings(graph, position, before))


def _tuple_crossings(graph: LayerGraph, position: Mapping[str, int], before: Sequence[int]) -> set[int]:
    """Cut indices at which a layer's tuple of tensors would be sent to a later stage (the runtime refuses it):
    the cut after model position ``last`` separates a tuple at ``p <= last`` from a reader past ``last``."""
    cuts: set[int] = set()
    for layer, p in position.items():
        readers = [position[r] for r in graph.successors(layer) if r in position]
        if not readers or not crosses_as_tuple(graph, layer, lambda reader: True):
            continue
        cuts |= {i for i in range(1, len(before) + 1) if p <= before[i - 1] < max(readers)}
    return cuts


def _held_crossings(graph: LayerGraph, position: Mapping[str, int], before: Sequence[int]) -> set[int]:
    """Cut indices that would send a value no layer holds (an opaque call's ``(x, (h, w))``) to a later stage:
    the layers of each of the trace's ``held_together`` spans stay on one stage (the runtime refuses it)."""
    return _spanned_cuts([[position[layer] for layer in span if layer in position]
                          for span in graph.graph.get("held_together", [])], before)


def _spanned_cuts(spans: Sequence[Sequence[int]], before: Sequence[int]) -> set[int]:
    """Cut indices that fall inside any of ``spans`` (model positions that must stay on one stage)."""
    cuts: set[int] = set()
    for spots in spans:
        if len(spots) > 1:
            cuts |= {i for i in range(1, len(before) + 1) if min(spots) <= before[i - 1] < max(spots)}
    return cuts


def _shared_crossings(graph: LayerGraph, position: Mapping[str, int], before: Sequence[int]) -> set[int]:
    """Cut indices that would put two calls of one module with parameters on two stages (the runtime refuses
    it: ``cost_models.capability.shared_modules``)."""
    return _spanned_cuts([[position[layer] for layer in layers if layer in position]
                          for layers in shared_modules(graph).values()], before)
