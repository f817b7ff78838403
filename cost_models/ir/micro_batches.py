"""How a ``sync`` pipeline cuts its batch into micro-batches, and a layer's shapes on one of them.

The batch of ``N`` samples is cut as ``torch.tensor_split`` cuts it into ``M``
parts: the first ``N mod M`` micro-batches hold ``⌈N/M⌉`` samples, the rest
``⌊N/M⌋`` — equal when ``M`` divides ``N``, otherwise two sizes one apart
(an "uneven" count). The planner prices every micro-batch as the largest
(``cost_models.estimate``); the runtime runs each at its own size
(``runtime.pipeline.stage``), and each micro-batch's loss counts by its share of the
samples, so one iteration equals the unsplit model on the whole batch.

A layer's shapes on a micro-batch of ``s`` samples scale the first dimension
of each of its tensors computed from the model's inputs by ``s/N`` (rounded
up): the batch, and what the trace recorded as proportional to it. Tensors
computed from parameters and constants alone (a weight standardisation's
filters, a positional table) keep their shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from cost_models.errors import InputError
from cost_models.ir.layer import Layer

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["micro_batch_graph", "micro_batch_node", "micro_batch_nodes", "micro_batch_sizes", "micro_batch_starts"]


def micro_batch_sizes(batch: int, count: int) -> tuple[int, ...]:
    """The samples of each of ``count`` micro-batches of ``batch`` (the module docstring's cut).

    Raises:
        InputError: ``count`` is not between 1 and ``batch``.
    """
    if not 1 <= count <= batch:
        raise InputError(f"{count} micro-batches of a batch of {batch}: each needs at least one sample; "
                         f"choose 1 to {batch}")
    whole, rest = divmod(batch, count)
    return tuple(whole + (index < rest) for index in range(count))


def micro_batch_starts(batch: int, count: int) -> tuple[int, ...]:
    """The index of each micro-batch's first sample in the batch."""
    starts, first = [], 0
    for size in micro_batch_sizes(batch, count):
        starts.append(first)
        first += size
    return tuple(starts)


def micro_batch_node(layer: Layer, batch: int, samples: int,
                     from_batch: tuple[bool, Sequence[bool]] | None = None) -> Layer:
    """``layer`` with its shapes on a micro-batch of ``samples`` of the ``batch`` samples.

    ``from_batch``: whether its output, and each of its inputs, is computed from the model's inputs (only those
    scale); default: all of them.
    """
    output, inputs = from_batch if from_batch is not None else (True, None)

    def scaled(shape: list[Any], scales: bool = True) -> list[Any]:
        if not scales or not shape or isinstance(shape[0], list):
            return shape
        return [-(-shape[0] * samples // batch), *shape[1:]]
    return replace(layer, output_shape=scaled(layer.output_shape, output),
                   input_shapes=[scaled(shape, True if inputs is None else inputs[index])
                                 for index, shape in enumerate(layer.input_shapes)])


def micro_batch_nodes(graph: LayerGraph, samples: int) -> dict[str, Layer]:
    """Every layer's data (:func:`micro_batch_node`) on a micro-batch of ``samples`` of ``graph``'s batch."""
    batch, flows = int(graph.input_shape[0]), graph.batch_layers()
    found = {}
    for name, data in graph.nodes(data=True):
        sources = [source in flows for source in graph.predecessors(name)]
        known = len(sources) == len(data.input_shapes)  # each input's producer (argument order)
        found[name] = micro_batch_node(data, batch, samples, (name in flows, sources) if known else None)
    return found


def micro_batch_graph(graph: LayerGraph, micro: int, *, smallest: bool = False) -> LayerGraph:
    """A copy of ``graph`` whose shapes carry the samples of the largest (``smallest``: the smallest) of ``micro``
    micro-batches (:func:`micro_batch_nodes`; ``estimate`` costs the largest).

    Each layer's inputs keep their argument order (``graph.predecessors``), which
    ``networkx``'s own ``copy`` would reorder by producer.
    """
    if micro == 1:
        return graph
    batch = int(graph.input_shape[0])
    sizes = micro_batch_sizes(batch, micro)
    samples = sizes[-1] if smallest else sizes[0]
    scaled = type(graph)()
    scaled.graph.update(graph.graph)
    for name, data in micro_batch_nodes(graph, samples).items():
        scaled.add_node(name, data)
    scaled.add_edges_from((source, name, dict(graph.edges[source, name]))
                          for name in graph.nodes for source in graph.predecessors(name))
    return scaled
