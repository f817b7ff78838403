"""Floating-point operation counts of one layer's forward and backward passes.

Pure arithmetic on shapes, so cost models can count the FLOPs of any *local*
problem (a tile, a slice of the batch) without torch.

Assumptions:
    * Convolution and linear layers count a multiply and an add as two FLOPs,
      bias excluded — the convention of ``torch.utils.flop_counter``; the test
      suite checks these counts against ``FlopCounterMode`` on real models.
    * Their backward is two problems of the forward's size: backward-data
      (only when the layer's input needs a gradient, i.e. something before it
      has parameters) and backward-weight (only when it has weights).
    * Every other layer is counted per element, with the per-element operation
      counts of ``_PER_ELEMENT`` (forward, backward-data): these layers are
      bound by memory, not arithmetic; the counts only rank problem sizes and
      never stand in for a timed kernel.
    * Pooling counts one operation per window element per output element.
    * A layer whose forward was counted by ``torch.utils.flop_counter`` at trace
      time (a module kept opaque: ``flops_per_output`` in its attributes, the
      counted forward FLOPs per output element) scales that count with its
      output; its backward-data and backward-weight passes are each counted as
      one forward, as for dense layers.
    * Shapes are read defensively: only plain shapes among the inputs count
      (a tuple-valued input is skipped), a dense layer with no tensor input
      takes its output's shape, and one with no known weight shape reads its
      weight from its second input (``F.conv2d(x, w)`` with a computed ``w``)
      or is counted per element.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

__all__ = ["Flops", "attention_flops", "layer_flops"]

Shape = Sequence[int]

# kind -> (forward ops per output element, backward-data ops per output element)
_PER_ELEMENT: dict[str, tuple[int, int]] = {
    "batchnorm": (4, 6),
    "norm": (5, 8),
    "activation": (1, 1),
    "add": (1, 0),
    "mul": (1, 2),
    "elementwise": (1, 1),
    "softmax": (4, 4),
    "dropout": (1, 1),
    "upsample": (1, 1),
    "mean": (1, 1),
}
_POOLING = ("maxpool", "avgpool")


@dataclass(frozen=True)
class Flops:
    """FLOPs of the forward, backward-data and backward-weight passes of one layer."""

    fwd: int = 0
    bwd_data: int = 0
    bwd_weight: int = 0

    @property
    def bwd(self) -> int:
        """Backward total: data plus weight."""
        return self.bwd_data + self.bwd_weight


def layer_flops(
    kind: str,
    input_shapes: Sequence[Shape],
    output_shape: Shape,
    attrs: dict[str, Any],
    *,
    needs_input_grad: bool,
    has_weight: bool,
) -> Flops:
    """FLOPs of a layer of ``kind`` on the given (global or local) shapes.

    Args:
        kind: Layer kind as set by tracing (``conv``, ``linear``, ``maxpool``, ...).
        input_shapes: Shapes of the tensor inputs, in argument order.
        output_shape: Shape of the (single) output tensor.
        attrs: Layer attributes; convolutions need ``weight_shape`` and
            ``transposed``, linear layers ``weight_shape``, pooling ``kernel_size``.
        needs_input_grad: Whether backward must produce the input's gradient.
        has_weight: Whether the layer has trainable weights (backward-weight runs).
    """
    inputs = _plain_shapes(input_shapes)
    output = _first_plain(output_shape)
    if attrs.get("flops_per_output") is not None:
        return _counted_flops(float(attrs["flops_per_output"]), output, needs_input_grad, has_weight)
    if kind == "attention" and inputs:
        return attention_flops(inputs, output, attrs, needs_input_grad=needs_input_grad, has_weight=has_weight)
    weight = _dense_weight(kind, attrs, inputs, output)
    if weight is None:
        return _elementwise_flops(kind, inputs, output, attrs, needs_input_grad, has_weight)
    source = inputs[0] if inputs else output  # a dense map of a parameter or constant: no tensor input
    dense = _conv_flops(source, output, weight, attrs) if kind != "linear" else _linear_flops(source, weight)
    return Flops(
        fwd=dense,
        bwd_data=dense if needs_input_grad else 0,
        bwd_weight=dense if has_weight else 0,
    )


def attention_flops(inputs: Sequence[Shape], output: Shape, attrs: dict[str, Any], *, needs_input_grad: bool,
                    has_weight: bool) -> Flops:
    """Multi-head attention: ``nn.MultiheadAttention`` (its four projections and the attention between them)
    or ``F.scaled_dot_product_attention`` (the attention alone).

    The attention of ``L`` queries over ``S`` keys in ``H`` heads of ``Dk`` (``Dv``) features each: ``QKᵀ`` and
    the weighted sum of values, ``2·N·H·L·S·(Dk + Dv)``, and a softmax of ``4`` per score. Its backward is
    twice that (the gradients of scores, queries, keys and values) whatever needs a gradient; the projections
    count as linear layers do: once forward, once for the inputs' gradient, once for the weights'. A rank of a
    split into ``heads_parts`` computes its heads and its rows of every projection: a ``1/heads_parts`` share."""
    query = inputs[0]
    key, value = (inputs[1], inputs[2]) if len(inputs) == 3 else (inputs[1], inputs[1]) if len(inputs) == 2 \
        else (query, query)  # self-attention reads one tensor three times
    if attrs.get("form") == "module":
        heads, embed = int(attrs["num_heads"]), int(attrs["embed_dim"])
        samples = query[0] if attrs.get("batch_first") or len(query) == 2 else query[1]
        length, keys = prod(query[:-1]) // samples, prod(key[:-1]) // samples
        scores = samples * heads * length * keys
        core = 2 * scores * 2 * (embed // heads)
        projections = 2 * samples * (length * embed * embed * 2 + keys * embed * (key[-1] + value[-1]))
        inward = 2 * samples * length * embed * embed  # the output projection's: the attention needs it anyway
    else:
        scores = prod(query[:-1]) * key[-2]
        core, projections, inward = 2 * scores * (query[-1] + value[-1]), 0, 0
    parts = int(attrs.get("heads_parts", 1))  # a rank of a head split: its heads, its rows of each projection
    core, projections, inward, scores = core // parts, projections // parts, inward // parts, scores // parts
    softmax = 4 * scores
    return Flops(fwd=core + softmax + projections,
                 bwd_data=2 * (core + softmax) + (projections - (projections - inward) * (not needs_input_grad)),
                 bwd_weight=projections if has_weight else 0)


def _plain_shapes(shapes: Sequence[Any]) -> list[list[int]]:
    """The shapes that are flat sequences of ints (a tuple-valued tensor's list of shapes is left out)."""
    return [list(s) for s in shapes if isinstance(s, (list, tuple)) and all(isinstance(d, int) for d in s)]


def _first_plain(shape: Any) -> list[int]:
    """``shape``, or the first flat shape inside a nested one (a layer with several outputs: costed by its first)."""
    while isinstance(shape, (list, tuple)) and shape and isinstance(shape[0], (list, tuple)):
        shape = shape[0]
    return [int(d) for d in shape] if isinstance(shape, (list, tuple)) else []


def _dense_weight(kind: str, attrs: dict[str, Any], inputs: list[list[int]], output: list[int]) -> list[int] | None:
    """A convolution's or linear layer's weight shape: traced, or its second input's; ``None`` when neither."""
    if kind not in ("conv", "conv_transpose", "linear"):
        return None
    rank = 2 if kind == "linear" else len(output)
    candidates = [attrs.get("weight_shape"), inputs[1] if len(inputs) > 1 else None]
    return next((list(w) for w in candidates if w and len(w) == rank and rank >= 2), None)


def _counted_flops(per_output: float, output: Shape, needs_input_grad: bool, has_weight: bool) -> Flops:
    fwd = round(per_output * prod(output))
    return Flops(fwd=fwd, bwd_data=fwd if needs_input_grad else 0, bwd_weight=fwd if has_weight else 0)


def _conv_flops(input_shape: Shape, output_shape: Shape, weight_shape: Shape, attrs: dict[str, Any]) -> int:
    window = prod(weight_shape[2:])
    if attrs.get("transposed", False):
        # weight (C_in, C_out/groups, *k); every input point meets every kernel tap.
        c_in, c_out_per_group = weight_shape[0], weight_shape[1]
        return 2 * input_shape[0] * prod(input_shape[2:]) * window * c_in * c_out_per_group
    # weight (C_out, C_in/groups, *k); every output point reads one window per input channel of its group.
    c_out, c_in_per_group = weight_shape[0], weight_shape[1]
    return 2 * output_shape[0] * prod(output_shape[2:]) * window * c_out * c_in_per_group


def _linear_flops(input_shape: Shape, weight_shape: Shape) -> int:
    out_features, in_features = weight_shape
    rows = prod(input_shape[:-1])
    return 2 * rows * in_features * out_features


def _elementwise_flops(
    kind: str,
    input_shapes: Sequence[Shape],
    output_shape: Shape,
    attrs: dict[str, Any],
    needs_input_grad: bool,
    has_weight: bool,
) -> Flops:
    out_elements = prod(output_shape)
    if kind in _POOLING:
        window = prod(_per_axis(attrs.get("kernel_size") or 1, max(1, len(output_shape) - 2)))
        return Flops(fwd=out_elements * window, bwd_data=out_elements * window if needs_input_grad else 0)
    if kind in ("adaptive_avgpool", "adaptive_maxpool"):
        in_elements = prod(input_shapes[0]) if input_shapes else out_elements
        return Flops(fwd=in_elements, bwd_data=in_elements if needs_input_grad else 0)
    fwd_ops, bwd_ops = _PER_ELEMENT.get(kind, (0, 0))
    return Flops(
        fwd=fwd_ops * out_elements,
        bwd_data=bwd_ops * out_elements if needs_input_grad else 0,
        bwd_weight=2 * out_elements if has_weight else 0,
    )


def _per_axis(value: Any, axes: int) -> tuple[int, ...]:
    """A hyper-parameter per spatial axis: as given when a sequence, else one value repeated ``axes`` times."""
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),) * axes
