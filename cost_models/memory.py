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
      and adaptive pooling, upsampling and views keep nothing. A convolution
      split by space keeps its tile (its interior is computed from it while
      the halos travel) and its halo-extended copy (the border bands read
      it: ``runtime.overlap``). A kept input is
      ``saved_input`` (the producer's output itself when the layer reads it as
      it is: ``cost_models.estimate`` counts a tensor kept by several layers
      once); what the layer makes and keeps is ``saved_own``.
    * A layer's transient is what its passes allocate and free: forward, its
      output; backward, the output gradient it receives, its input and weight
      gradients, and its kernels' workspace — the peak bytes calibration
      measured for the local problem's passes where the profile has them
      (``ComputeSample.peak_bytes``: oneDNN's weight-gradient convolution on
      small maps allocates four times its weights, per thread: a run with more
      threads per rank than calibration's gets what the profile measured the
      peak to grow by per thread), the gradients alone where it does not. The
      backward passes timed apart (data and weight gradients) run as one call
      that returns both gradients and reuses one workspace: their workspaces
      (a pass's peak less what it returns) count once, the largest (a 3-D
      convolution's column buffer is as large as its gradients).
    * The peak of a step is all weights, gradients, optimizer state, then,
      layer by layer, the activations saved so far plus that layer's
      transient (``cost_models.estimate``). Received halos are part of the
      halo-extended local input, so they are counted with it.
    * A stale pipeline stage keeps ``staleness`` extra copies of its input
      (DSP recomputes the forward from them).
    * Mixed precision (``--amp``): weights, gradients and optimizer state in
      the weights' dtype (float32); activations, what layers keep and their
      transients in the dtype each layer computes in (traced under autocast);
      a convolution or linear layer also keeps autocast's half-precision copy
      of its weights for backward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod

from cost_models.errors import InputError
from cost_models.ir.graph import dtype_itemsize
from cost_models.ir.kinds import DENSE_KINDS
from cost_models.ir.layer import Layer
from cost_models.layout import Layout
from cost_models.local_problem import LocalProblem

__all__ = ["OPTIMIZER_STATE_COPIES", "WEIGHT_SPLIT_KINDS", "LayerMemory", "StepLayer", "distinct_saved_bytes",
           "layer_memory", "parameter_tensors", "stage_peak_bytes"]



OPTIMIZER_STATE_COPIES = {"sgd": 0, "momentum": 1, "adam": 2}
_KEEP_INPUT = DENSE_KINDS | {"batchnorm", "norm"}
_AUTOCAST_WEIGHTS = DENSE_KINDS
"""Kinds autocast runs on a cast copy of their weights (kept for backward)."""
WEIGHT_SPLIT_KINDS = DENSE_KINDS | {"batchnorm"}
"""Kinds whose weights a ``c`` split slices (the others keep them whole on every rank)."""


@dataclass(frozen=True)
class LayerMemory:
    """Bytes of one layer on one rank, per term."""

    weights: int
    gradients: int
    optimizer: int
    saved_input: int
    saved_own: int
    transient: int

    @property
    def saved(self) -> int:
        """Bytes kept for backward, its input's counted as if no other layer kept it."""
        return self.saved_input + self.saved_own

    @property
    def resident_bytes(self) -> int:
        """What stays allocated through the step."""
        return self.weights + self.gradients + self.optimizer + self.saved


def parameter_tensors(layer: Layer) -> int:
    """How many parameter tensors ``layer`` holds: its weight, and one more when ``params`` count more (a bias,
    a norm's shift); none without parameters."""
    params = int(layer.params or 0)
    if params == 0:
        return 0
    weight = prod(layer.weight_shape) if layer.weight_shape else params
    return 1 + (params > weight)


def layer_memory(layer: Layer, layout: Layout, problem: LocalProblem | None, optimizer: str,
                 itemsize: int, kernel_peaks: Mapping[str, int | None] | None = None) -> LayerMemory:
    """The memory terms of one layer on one rank; ``kernel_peaks``: the measured peak bytes of the local
    problem's passes (``fwd``, ``bwd`` or ``bwd_data``/``bwd_weight``) where calibration has them."""
    if optimizer not in OPTIMIZER_STATE_COPIES:
        raise InputError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZER_STATE_COPIES)}")
    split = layout.c if layer.kind in WEIGHT_SPLIT_KINDS else 1
    elements = -(-layer.params // split)
    weights = elements * itemsize
    output = _output_bytes(layer, layout, dtype_itemsize(layer.dtype) if layer.dtype else itemsize) \
        if problem is None else prod(problem.output_shape) * problem.itemsize
    saved_input, saved_own = _saved_bytes(layer, layout, problem)
    if problem is not None and problem.itemsize != itemsize and problem.kind in _AUTOCAST_WEIGHTS:
        saved_own += elements * problem.itemsize  # autocast's cast copy of the weights, kept for backward
    return LayerMemory(
        weights=weights,
        gradients=weights,
        optimizer=OPTIMIZER_STATE_COPIES[optimizer] * weights,
        saved_input=saved_input,
        saved_own=saved_own,
        transient=_transient_bytes(problem, output, weights, kernel_peaks or {}),
    )


@dataclass(frozen=True)
class StepLayer:
    """A layer of a stage as the step's peak sees it."""

    name: str
    kind: str
    saved_input_of: str
    """Whose output its kept input is (its own name: a tensor of its own)."""
    memory: LayerMemory
    bucketed: bool
    """Its weights' gradients live in buckets allocated for the run (replicated weights); else each gradient is
    allocated when backward reaches the layer, and freed by ``zero_grad(set_to_none=True)``."""
    received_bytes: int = 0
    """Bytes of its input it receives from other ranks' layouts (a redistribution's buffers, forward)."""


def stage_peak_bytes(layers: Sequence[StepLayer], in_flight: int = 1) -> int:
    """Peak bytes of one rank over a step of ``layers`` (in forward order).

    Held throughout: weights, optimizer state and gradient buckets. Layer by layer, backward (in reverse)
    holds the activations kept up to the layer (each tensor once; ``in_flight`` micro-batches of them), the
    unbucketed gradients of the layers after it, and the layer's transient; the peak is the largest of these.
    """
    held = sum(layer.memory.weights + layer.memory.optimizer + (layer.memory.gradients if layer.bucketed else 0)
               for layer in layers)
    kept_by = []  # the activations kept up to each layer
    seen: dict[str, int] = {}
    for layer in layers:
        _keep(seen, layer)
        kept_by.append(sum(seen.values()))
    peak = later_gradients = 0
    for layer, kept in zip(reversed(layers), reversed(kept_by)):
        transient = max(layer.memory.transient, layer.received_bytes)
        peak = max(peak, in_flight * kept + later_gradients + transient)
        later_gradients += 0 if layer.bucketed else layer.memory.gradients
    return held + max(peak, later_gradients)


def distinct_saved_bytes(layers: Sequence[StepLayer]) -> int:
    """Bytes the ``layers`` keep for backward, a tensor kept by several of them counted once."""
    seen: dict[str, int] = {}
    for layer in layers:
        _keep(seen, layer)
    return sum(seen.values())


def _keep(seen: dict[str, int], layer: StepLayer) -> None:
    """Record what one layer keeps: its input under the name of whose output it is (its own if a copy), what it
    makes under its own name (an activation keeps its output: the tensor its consumers read as it is)."""
    memory, name = layer.memory, layer.name
    if memory.saved_input:
        key = layer.saved_input_of if layer.saved_input_of != name else f"{name}#input"
        seen[key] = max(seen.get(key, 0), memory.saved_input)
    if memory.saved_own:
        key = name if layer.kind == "activation" else f"{name}#own"
        seen[key] = max(seen.get(key, 0), memory.saved_own)


def _transient_bytes(problem: LocalProblem | None, output: int, weights: int,
                     peaks: Mapping[str, int | None]) -> int:
    """The larger of the forward's (output, or its measured peak) and the backward's (output gradient, plus the
    input and weight gradients, or what the measured peaks of the backward passes say they return and use)."""
    inputs = 0 if problem is None else sum(prod(shape) for shape in problem.input_shapes) * problem.itemsize
    forward = max(output, peaks.get("fwd") or 0)
    made_by = {"bwd": inputs + weights, "bwd_data": inputs, "bwd_weight": weights}  # what each pass returns
    backward_phases = [phase for phase in made_by if peaks.get(phase) is not None]
    if not backward_phases:
        return max(forward, output + inputs + weights)
    # one backward call returns every pass's gradients and reuses one workspace (freed between them)
    workspace = max(max(0, (peaks[phase] or 0) - made_by[phase]) for phase in backward_phases)
    return max(forward, output + sum(made_by[phase] for phase in backward_phases) + workspace)


def _saved_bytes(layer: Layer, layout: Layout, problem: LocalProblem | None) -> tuple[int, int]:
    """Bytes kept of the layer's input, and of what it makes (its output, indices, a mask)."""
    if problem is None or not (layer.requires_grad or layer.needs_input_grad):
        return 0, 0
    size = problem.itemsize
    inputs = sum(prod(shape) for shape in problem.input_shapes) * size
    output = prod(problem.output_shape)
    kind = problem.kind
    tile = _tile_bytes(layer, layout, size)
    if kind == "conv" and tile is not None and tile < prod(problem.input_shapes[0]) * size:
        return tile, inputs  # interior from the bare tile, bands from the halo-extended copy (runtime.overlap)
    if kind in _KEEP_INPUT:
        return inputs, 0
    if kind == "activation":
        return 0, output * size
    if kind == "maxpool":
        return inputs, output * 8
    if kind == "dropout":
        return 0, output
    return 0, 0


def _tile_bytes(layer: Layer, layout: Layout, itemsize: int) -> int | None:
    """Bytes of the tile of the layer's first input a spatially split layer receives, before any halo."""
    shapes = layer.input_shapes or []
    if layout.spatial == 1 or not shapes or len(shapes[0]) not in (3, 4, 5) or not layout.fits(tuple(shapes[0])):
        return None
    return prod(layout.local_shape(tuple(shapes[0]))) * itemsize


def _output_bytes(layer: Layer, layout: Layout, itemsize: int) -> int:
    shape = layer.output_shape
    if not shape or isinstance(shape[0], list):
        return 0
    if (len(shape) in (4, 5) or layer.attrs.get("order") == "ncw") and layout.fits(tuple(shape)):
        return prod(layout.local_shape(tuple(shape))) * itemsize
    return prod(shape) * itemsize // max(1, layout.n)
