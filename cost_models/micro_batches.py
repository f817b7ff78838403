"""How a ``sync`` pipeline cuts its batch into micro-batches, and a layer's shapes on one of them.

The batch of ``N`` samples is cut as ``torch.tensor_split`` cuts it into ``M``
parts: the first ``N mod M`` micro-batches hold ``⌈N/M⌉`` samples, the rest
``⌊N/M⌋`` — equal when ``M`` divides ``N``, otherwise two sizes one apart
(an "uneven" count). The planner prices every micro-batch as the largest
(``cost_models.estimate``); the runtime runs each at its own size
(``runtime.pipeline``), and each micro-batch's loss counts by its share of the
samples, so one iteration equals the unsplit model on the whole batch.

A layer's shapes on a micro-batch of ``s`` samples scale the first dimension
of each of its tensors by ``s/N`` (rounded up): the batch, and what the trace
recorded as proportional to it.
"""

from __future__ import annotations

from typing import Any, Mapping

from cost_models.errors import InputError

__all__ = ["micro_batch_node", "micro_batch_sizes", "micro_batch_starts"]


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


def micro_batch_node(data: Mapping[str, Any], batch: int, samples: int) -> dict[str, Any]:
    """A LayerGraph node's data with its shapes on a micro-batch of ``samples`` of the ``batch`` samples."""
    def scaled(shape: list[Any]) -> list[Any]:
        if not shape or isinstance(shape[0], list):
            return shape
        return [-(-shape[0] * samples // batch), *shape[1:]]
    return {**data, "output_shape": scaled(data["output_shape"]),
            "input_shapes": [scaled(shape) for shape in data.get("input_shapes", [])]}
