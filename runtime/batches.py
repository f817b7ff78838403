"""A rank's box of each training batch (:data:`Batch`): synthetic data each rank generates for its own box only,
identical to the global batch's box, or the user's ``--data`` factory's (:func:`factory_batches`).

Every element is a hash of its global index and the step's seed
(``frac(sin(i·12.9898 + seed·78.233)·43758.5453)``, the classic shader hash,
in float64), so a rank makes exactly its part of the batch without ever
holding the whole — large samples stay split from the start — and the unsplit
model (``parplan run --verify``) sees the same numbers. Inputs are uniform
with unit variance; labels are uniform over the classes, per sample for a
``(N, K)`` output and per pixel for an ``(N, K, H, W)`` one. A model taking
several tensors gets one synthetic tensor per input (:func:`synthetic_inputs`),
input ``k`` hashed with the seed shifted by ``k ·`` :data:`INPUT_SEED_STRIDE`, so
that the inputs differ from each other while every rank's box of each is still
the box of the whole tensor.

A user data factory (``parplan run --data module:function``) replaces this:
``function(input_box, target_box, step)`` returns this rank's input and
target, each box a tuple of slices (with explicit bounds) of the global
tensor; ``--verify`` calls it with whole boxes for the unsplit model
(``examples/pattern_data.py`` is an example). For a model taking several
tensors, ``input_box`` is a tuple of such boxes, one per input in the
forward's argument order, and the factory returns ``(inputs, target)`` with
``inputs`` a tuple of this rank's tensors in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["INPUT_SEED_STRIDE", "Batch", "factory_batches", "synthetic_input", "synthetic_inputs", "synthetic_labels",
           "synthetic_target"]

INPUT_SEED_STRIDE = 104_729
"""How far apart the seeds of a model's inputs are (input 0 keeps the step's seed; a prime, far from the
label offset and from the steps of a run)."""


def synthetic_input(shape: Sequence[int], box: Sequence[slice], seed: int, dtype: torch.dtype,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """The ``box`` of the global synthetic input of ``shape`` for ``seed`` (unit variance, zero mean)."""
    uniform = _hash(_linear_index(shape, box), seed)
    return ((uniform * 2 - 1) * 3**0.5).to(dtype=dtype, device=device)


def synthetic_inputs(shapes: Sequence[Sequence[int]], boxes: Sequence[Sequence[slice]], seed: int,
                     dtype: torch.dtype, device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
    """Each input's ``box`` of its global synthetic tensor for ``seed``, in argument order (the first one is
    :func:`synthetic_input`'s)."""
    return tuple(synthetic_input(shape, box, seed + index * INPUT_SEED_STRIDE, dtype, device)
                 for index, (shape, box) in enumerate(zip(shapes, boxes)))


def synthetic_labels(shape: Sequence[int], box: Sequence[slice], classes: int, seed: int,
                     device: torch.device | str = "cpu") -> torch.Tensor:
    """The ``box`` of global integer labels in ``[0, classes)`` of ``shape`` (``(N,)`` or ``(N, H, W)``)."""
    uniform = _hash(_linear_index(shape, box), seed + 7919)
    return (uniform * classes).long().clamp(max=classes - 1).to(device)


def synthetic_target(shape: Sequence[int], box: Sequence[slice], classes: int, seed: int, dtype: torch.dtype,
                     device: torch.device | str = "cpu", *, regression: bool = False) -> torch.Tensor:
    """The ``box`` of the global synthetic target of ``shape``: labels (:func:`synthetic_labels`, any shape —
    ``(N, 1, H, W)`` too), or with ``regression`` values in ``[0, 1)`` of ``dtype`` (a target of the output's
    shape, ``runtime.losses``)."""
    if not regression:
        return synthetic_labels(shape, box, classes, seed, device)
    return _hash(_linear_index(shape, box), seed + 7919).to(dtype=dtype, device=device)


def _linear_index(shape: Sequence[int], box: Sequence[slice]) -> torch.Tensor:
    """Row-major global index of every element of ``box`` (float64: exact below 2**53)."""
    index = torch.zeros((), dtype=torch.float64)
    for axis, (extent, part) in enumerate(zip(shape, box)):
        start, stop, _ = part.indices(extent)
        positions = torch.arange(start, stop, dtype=torch.float64)
        index = index.unsqueeze(-1) * extent + positions.view(*([1] * axis), -1)
    return index


def _hash(index: torch.Tensor, seed: int) -> torch.Tensor:
    value = torch.sin(index * 12.9898 + seed * 78.233) * 43758.5453
    return value - torch.floor(value)


Batch = Callable[[int], tuple[tuple[torch.Tensor, ...], torch.Tensor]]
"""Step → this rank's boxes of the model's inputs (in argument order) and of the labels."""


def factory_batches(spec: str, input_boxes: tuple[tuple[slice, ...], ...], label_box: tuple[slice, ...],
                    dtype: torch.dtype, device: torch.device) -> Batch:
    """Step → the ``--data`` factory's (inputs, target) for these boxes (``runtime.batches``'s contract): one input
    box and one input tensor for a single-input model, a tuple of each for a model taking several. Floating
    inputs are cast to the run's ``dtype``."""
    from cost_models.ir.model_spec import resolve_factory

    factory: Callable[..., Any] = resolve_factory(spec)  # the user's ``function(input_box, target_box, step)``
    several = len(input_boxes) > 1

    def load(step: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        inputs, target = factory(input_boxes if several else input_boxes[0], label_box, step)
        return tuple(_as_input(t, dtype, device) for t in (inputs if several else (inputs,))), target.to(device)

    return load


def _as_input(tensor: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return tensor.to(device=device, dtype=dtype) if tensor.is_floating_point() else tensor.to(device)
