"""Bytes one rank holds for a layer under a layout, and the peak over a training step.

Assumptions:
    * Weights and their gradients are split by ``c`` where the layer's weights
      are (filters of convolution/linear, channels of batch-norm), else
      replicated on every rank of the layer.
    * Optimizer state per weight: SGD none, SGD with momentum one copy, Adam
      two copies (first and second moments).
    * Saved for backward, on the local shapes (halo-extended inputs included):
      convolution, linear and batch-norm keep their input; activations keep
      their output; max-pooling keeps its input and int64 indices of its
      output; dropout keeps a one-byte mask; additions, concatenation, average
      and adaptive pooling, upsampling and views keep nothing.
    * The peak of a step is all weights, gradients, optimizer state and saved
      activations, plus the largest transient of one layer: its output and
      output gradient, and its gradient bucket. Received halos are part of the
      halo-extended local input, so they are counted with it.
    * A stale pipeline stage keeps ``staleness`` extra copies of its input
      (DSP recomputes the forward from them).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any, Mapping

from cost_models.errors import InputError
from cost_models.layout import Layout
from cost_models.local_problem import DENSE_KINDS, LocalProblem

__all__ = ["OPTIMIZER_STATE_COPIES", "LayerMemory", "layer_memory", "parameter_tensors"]

OPTIMIZER_STATE_COPIES = {"sgd": 0, "momentum": 1, "adam": 2}
_KEEP_INPUT = DENSE_KINDS | {"batchnorm", "norm"}


@dataclass(frozen=True)
class LayerMemory:
    """Bytes of one layer on one rank, per term."""

    weights: int
    gradients: int
    optimizer: int
    saved: int
    transient: int

    @property
    def resident_bytes(self) -> int:
        """What stays allocated through the step."""
        return self.weights + self.gradients + self.optimizer + self.saved


def parameter_tensors(layer: Mapping[str, Any]) -> int:
    """How many parameter tensors ``layer`` holds: its weight, and one more when ``params`` count more (a bias,
    a norm's shift); none without parameters."""
    params = int(layer.get("params") or 0)
    if params == 0:
        return 0
    weight = prod(layer["weight_shape"]) if layer.get("weight_shape") else params
    return 1 + (params > weight)


def layer_memory(layer: Mapping[str, Any], layout: Layout, problem: LocalProblem | None, optimizer: str,
                 itemsize: int) -> LayerMemory:
    """The memory terms of one layer on one rank."""
    if optimizer not in OPTIMIZER_STATE_COPIES:
        raise InputError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZER_STATE_COPIES)}")
    split = layout.c if layer["kind"] in DENSE_KINDS | {"batchnorm"} else 1
    weights = -(-layer.get("params", 0) // split) * itemsize
    output = _output_bytes(layer, layout, itemsize) if problem is None else prod(problem.output_shape) * itemsize
    return LayerMemory(
        weights=weights,
        gradients=weights,
        optimizer=OPTIMIZER_STATE_COPIES[optimizer] * weights,
        saved=_saved_bytes(layer, problem),
        transient=2 * output + weights,
    )


def _saved_bytes(layer: Mapping[str, Any], problem: LocalProblem | None) -> int:
    if problem is None or not (layer.get("requires_grad") or layer.get("needs_input_grad")):
        return 0
    size = problem.itemsize
    inputs = sum(prod(shape) for shape in problem.input_shapes) * size
    output = prod(problem.output_shape)
    kind = problem.kind
    if kind in _KEEP_INPUT:
        return inputs
    if kind == "activation":
        return output * size
    if kind == "maxpool":
        return inputs + output * 8
    if kind == "dropout":
        return output
    return 0


def _output_bytes(layer: Mapping[str, Any], layout: Layout, itemsize: int) -> int:
    shape = layer["output_shape"]
    if not shape or isinstance(shape[0], list):
        return 0
    if len(shape) == 4 and layout.fits(tuple(shape)):
        return prod(layout.local_shape(tuple(shape))) * itemsize
    return prod(shape) * itemsize // max(1, layout.n)
