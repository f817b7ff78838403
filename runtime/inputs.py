"""The model's inputs on a rank: which nodes of the traced program they are, where each is loaded, its box.

A model may take several tensors (``forward(x, cond)``): the first ``k``
placeholders of the traced program are its inputs, in the forward's argument
order, one per shape of ``LayerGraph.input_shapes`` (``cost_models.ir.tracing``).
Each is loaded in the placement its first layer reads — over the whole
program, so that every pipeline stage agrees where an input read late is held
(loading it there is free; the planner prices it so). An input no layer reads,
or one whose features that placement would split (a 3-D ``(N, T, D)`` input
read by a channel split), is loaded whole. A placeholder the trace kept after
the inputs (a specialised argument it could not drop) is fed the first input,
as the runtime always did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch.fx import Node

from cost_models.ir.orders import NCDHW, NCW
from cost_models.layout import Layout
from runtime.boxes import nd_box
from runtime.layers import read_placement
from runtime.placement import Placement

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["Inputs", "as_inputs", "input_boxes", "input_names", "input_placements", "placeholder_inputs",
           "placeholder_placements"]

Inputs = torch.Tensor | tuple[torch.Tensor, ...]
"""A batch's input as code passes it around: one tensor, or one per model input (in argument order)."""


def as_inputs(x: Inputs) -> tuple[torch.Tensor, ...]:
    """A batch's input as the tuple of the model's inputs."""
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def input_names(nodes: Sequence[Node], count: int) -> list[str]:
    """The names of the model's ``count`` input nodes (the first placeholders), in argument order."""
    return [node.name for node in nodes if node.op == "placeholder"][:count]


def placeholder_inputs(nodes: Sequence[Node], count: int) -> dict[str, int]:
    """Per placeholder, the number of the model input it is fed (the first input past the ``count`` inputs)."""
    names = [node.name for node in nodes if node.op == "placeholder"]
    return {name: index if index < count else 0 for index, name in enumerate(names)}


def input_placements(nodes: Sequence[Node], layouts: Mapping[str, Layout], graph: LayerGraph,
                     size: int) -> dict[str, Placement]:
    """Per input node (of the whole program ``nodes``), the placement it is loaded in on ``size`` ranks."""
    shapes = graph.input_shapes
    found = {}
    for name, shape in zip(input_names(nodes, len(shapes)), shapes):
        placement = _first_reader_placement(nodes, name, layouts, graph)
        if len(shape) == 5:  # a volume is held in its own order (cost_models.ir.orders), as the layers make them
            placement = replace(placement, order=NCDHW)
        elif len(shape) == 3 and _read_as_sequence(nodes, name, layouts, graph):
            placement = replace(placement, order=NCW)
        whole = any(nd_box(shape, placement, member) is None for member in range(size))
        found[name] = Placement(Layout()) if whole else placement
    return found


def placeholder_placements(nodes: Sequence[Node], layouts: Mapping[str, Layout], graph: LayerGraph,
                           size: int) -> dict[str, Placement]:
    """Per placeholder, the placement of the input it is fed (:func:`placeholder_inputs`)."""
    placements = list(input_placements(nodes, layouts, graph, size).values())
    return {name: placements[index] for name, index in placeholder_inputs(nodes, len(placements)).items()}


def input_boxes(placements: Sequence[Placement], shapes: Sequence[Sequence[int]],
                member: int) -> tuple[tuple[slice, ...], ...]:
    """Member ``member``'s slices of each input of global ``shapes`` held under ``placements`` (one per dimension)."""
    boxes = []
    for placement, shape in zip(placements, shapes):
        box = nd_box(shape, placement, member)
        boxes.append(tuple(slice(start, stop) for start, stop in box or ((0, int(e)) for e in shape)))
    return tuple(boxes)


def _first_reader(nodes: Sequence[Node], name: str, layouts: Mapping[str, Layout]) -> Node | None:
    return next((node for node in nodes if node.name in layouts and any(n.name == name for n in node.all_input_nodes)),
                None)  # a layer: shape reads of the input come first in some programs


def _first_reader_placement(nodes: Sequence[Node], name: str, layouts: Mapping[str, Layout],
                            graph: LayerGraph) -> Placement:
    reader = _first_reader(nodes, name, layouts)
    if reader is None:
        return Placement(Layout())
    return read_placement(graph.nodes[reader.name].kind, layouts[reader.name])


def _read_as_sequence(nodes: Sequence[Node], name: str, layouts: Mapping[str, Layout], graph: LayerGraph) -> bool:
    """Whether a 3-D input's first reader computes on it as a sequence ``(N, C, L)`` (``cost_models.ir.orders``)."""
    reader = _first_reader(nodes, name, layouts)
    return reader is not None and NCW in (graph.nodes[reader.name].attrs.get("input_orders") or [])
