"""The local problem one rank solves for a layer under a Layout, and its canonical key.

Splitting a layer by ``Layout(n, c, h, w)`` leaves each rank a smaller
problem of the same kind; calibration times those problems and the cost model
looks them up by :attr:`LocalProblem.key`, so both must derive them here.

Assumptions:
    * Parts are balanced (``torch.tensor_split``); the largest part is the one costed.
    * ``n`` splits the batch of every 4-D layer.
    * ``c`` splits output channels (filters) of convolution and linear layers —
      each rank keeps the full input and ``C_out/c`` filters; for grouped
      convolutions ``c`` must divide the groups, and each rank keeps ``groups/c``
      whole groups. Channel-wise layers (batch-norm, activations, pooling, adds)
      split their channels.
    * ``h``/``w`` split height and width of spatial layers. A convolution or
      pooling on a tile reads a halo-extended input with no padding on the split
      dimension: for ``o`` local output rows it needs ``(o−1)·stride +
      dilation·(k−1) + 1`` input rows (border tiles pad instead of receiving a
      halo: the same size). Transposed convolutions read ``⌈I/parts⌉`` input rows
      plus ``⌈(dilation·(k−1)+1−stride)/stride⌉`` halo rows when the kernel is
      wider than the stride. Global (1×1) adaptive pooling reduces each tile to
      one value per channel; adaptive pooling to ``O`` rows reads
      ``⌈o·I/O⌉ + 1`` rows for ``o`` local output rows. Linear layers take 2-D inputs and cannot split
      ``h``/``w``.
    * Layers that only move or view data (``flatten``, ``view``, ``getitem``,
      ``identity``, ``input``) have no local problem.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from cost_models.borders import axis_pads
from cost_models.capability.predicate import layer_refusal
from cost_models.ir.flops import Flops, layer_flops
from cost_models.ir.kinds import DENSE_KINDS, VIEW_KINDS
from cost_models.ir.layer import Layer, as_layer
from cost_models.ir.orders import NCDHW, NCHW, NCW, default_order
from cost_models.layout import Layout, whole_channels

__all__ = ["LocalProblem", "axis_value", "layer_problem", "local_problem", "phases_of"]

"""Kinds whose output aliases their input: they move no data and cost no time (``cost_models.ir.classify``)."""
_NO_PROBLEM = VIEW_KINDS | {"input"}
_SPATIAL_WINDOW = frozenset({"conv", "maxpool", "avgpool"})
_CHANNEL_SPLIT = frozenset({"batchnorm", "activation", "add", "mul", "elementwise", "dropout", "maxpool", "avgpool",
                            "adaptive_avgpool", "adaptive_maxpool", "upsample", "cat", "pad", "softmax", "norm"})


@dataclass(frozen=True)
class LocalProblem:
    """One rank's share of a layer: shapes, hyper-parameters, dtype, and the key they make."""

    kind: str
    input_shapes: tuple[tuple[int, ...], ...]
    output_shape: tuple[int, ...]
    weight_shape: tuple[int, ...] | None
    attrs: tuple[tuple[str, object], ...]
    dtype: str
    itemsize: int
    needs_input_grad: bool
    has_weight: bool

    @cached_property
    def key(self) -> str:
        """Canonical text naming everything the kernel's time depends on."""
        shapes = ";".join("x".join(map(str, s)) for s in self.input_shapes)
        weight = "x".join(map(str, self.weight_shape)) if self.weight_shape else "-"
        attrs = ",".join(f"{k}={_text(v)}" for k, v in self.attrs if k != "weight_shape")
        return f"{self.kind}|in={shapes}|w={weight}|out={'x'.join(map(str, self.output_shape))}|{attrs}|{self.dtype}"

    @cached_property
    def flops(self) -> Flops:
        """FLOPs of each pass on the local shapes."""
        return layer_flops(self.kind, [list(s) for s in self.input_shapes], list(self.output_shape), dict(self.attrs),
                           needs_input_grad=self.needs_input_grad, has_weight=self.has_weight)

    def phase_flops(self, phase: str) -> int:
        """FLOPs of one pass: ``fwd``, ``bwd_data``, ``bwd_weight`` or ``bwd``."""
        flops = self.flops
        return {"fwd": flops.fwd, "bwd_data": flops.bwd_data, "bwd_weight": flops.bwd_weight, "bwd": flops.bwd}[phase]

    def bytes_moved(self, phase: str) -> int:
        """Bytes a pass reads and writes once: inputs, weights, outputs (or their gradients)."""
        inputs = sum(_numel(s) for s in self.input_shapes) * self.itemsize
        output = _numel(self.output_shape) * self.itemsize
        weight = _numel(self.weight_shape) * self.itemsize if self.weight_shape else 0
        if phase == "bwd_weight":
            return inputs + output + weight
        if phase == "bwd":
            return 2 * inputs + output + 2 * weight  # reads input and grad_out, writes grad_in (+ weight grads)
        return inputs + output + weight


def phases_of(problem: LocalProblem) -> tuple[str, ...]:
    """The passes calibration times for a problem: separate backward kernels for dense layers."""
    if problem.kind in DENSE_KINDS:
        phases = ["fwd"]
        if problem.needs_input_grad:
            phases.append("bwd_data")
        if problem.has_weight:
            phases.append("bwd_weight")
        return tuple(phases)
    return ("fwd", "bwd") if problem.needs_input_grad or problem.has_weight else ("fwd",)


def local_problem(layer: Layer | Mapping[str, Any], layout: Layout, itemsize: int,
                  dtype: str) -> LocalProblem | None:
    """The local problem of ``layer`` (a LayerGraph node's data) under ``layout``.

    Returns:
        ``None`` when the layer has no compute of its own (views, the input) or
        the layout cannot apply to it (a split the kind does not support, more
        parts than elements, a tile narrower than its halo).
    """
    layer = as_layer(layer)
    kind = layer.kind
    if kind in _NO_PROBLEM or not _splittable(layer, layout):
        return None
    output = list(layer.output_shape)
    if output and isinstance(output[0], list):  # several output tensors, kept whole: costed by the first (as traced)
        output = list(output[0])
    attrs = dict(layer.attrs)
    own_order = attrs.get("order") or default_order(len(output))
    local_out = _split_shape(output, layout, own_order) if len(output) in (4, 5) or len(own_order) == len(output) \
        else _split_flat(output, layout)  # (a 3-D value with an order: a sequence ncw, tokens nwc)
    orders = attrs.get("input_orders") or [NCHW] * len(layer.input_shapes)
    # a filter split reads its channels whole
    read = whole_channels(layout) if kind in DENSE_KINDS | {"attention"} and layout.c > 1 else layout
    # F.conv2d's filters, window attention's position bias: whole
    shapes = layer.input_shapes[:1] if kind in ("conv", "window_attention") else layer.input_shapes
    inputs = [_split_shape(s, read, order) if _reordered(s, order) else
              _local_input(kind, list(s), output, local_out, layout, attrs, order)
              for s, order in zip(shapes, orders)] + [list(s) for s in layer.input_shapes[len(shapes):]]
    if any(s is None for s in inputs):
        return None
    if kind == "attention" and layout.w > 1:  # queries of its tokens; keys and values: every one
        wider = replace(read, w=1)
        every = [_split_shape(s, wider, order) for s, order in zip(shapes, orders)]
        inputs = [inputs[0], every[0], every[0]] if len(inputs) == 1 else [inputs[0], *every[1:]]
    if kind == "attention" and layout.c > 1:
        attrs["heads_parts"] = layout.c  # its heads (cost_models.ir.flops.attention_flops)
    weight = _local_weight(layer.weight_shape or _called_filters(layer), layout, kind, attrs)
    if kind == "pad" and isinstance(attrs.get("pad"), list) and inputs and len(local_out) == 4:
        attrs["pad"], inputs[0] = _tile_padding(attrs["pad"], inputs[0], local_out, layout)
    if kind in ("conv", "conv_transpose", "maxpool", "avgpool"):
        inputs[0] = _pre_padded(inputs[0], attrs, layout) if (kind == "conv" or "pads" in attrs) and inputs else \
            inputs[0]
        attrs = _unpad_split_dims(attrs, layout, len(local_out))
    if weight is not None:
        attrs["weight_shape"] = list(weight)
    if kind == "conv" and layout.c > 1 and attrs.get("groups", 1) > 1:
        attrs["groups"] = attrs["groups"] // layout.c
    return LocalProblem(
        kind=kind, input_shapes=tuple(tuple(s) for s in inputs), output_shape=tuple(local_out),
        weight_shape=tuple(weight) if weight else None, attrs=tuple(sorted((k, _freeze(v)) for k, v in attrs.items())),
        dtype=dtype, itemsize=itemsize, needs_input_grad=layer.needs_input_grad,
        has_weight=layer.has_weight,
    )


def layer_problem(layer: Layer, layout: Layout, dtype: str) -> LocalProblem | None:
    """:func:`local_problem` of a traced layer in a graph of ``dtype``: in the layer's own dtype under mixed
    precision (``cost_models.ir.graph.layer_dtype``)."""
    from cost_models.ir.graph import dtype_itemsize, layer_dtype

    own = layer_dtype(layer, dtype)
    return local_problem(layer, layout, dtype_itemsize(own), own)


def _called_filters(layer: Layer) -> list[int] | None:
    """The filters a convolution call computes from parameters (``F.conv2d(x, standardise(w))``) and reads whole."""
    shapes = layer.input_shapes
    return list(shapes[1]) if layer.kind == "conv" and len(shapes) > 1 and len(shapes[1]) == 4 else None


def _splittable(layer: Layer, layout: Layout) -> bool:
    """Whether the runtime executes the layer under ``layout`` (the one predicate,
    ``cost_models.capability.predicate``)."""
    return layer_refusal(layer, layout) is None


def _split_shape(shape: Sequence[int], layout: Layout, order: str = NCHW) -> list[int]:
    """The largest local part of a 4-D (5-D) ``shape`` whose dimensions hold the axes ``order`` names."""
    return [-(-int(extent) // getattr(layout, axis, 1)) for extent, axis in zip(shape, order)]  # ".": whole


def _reordered(shape: Sequence[int], order: str) -> bool:
    """Whether an input of ``shape`` holds its axes in an order of its own (channels-last, stacked branches)."""
    return (len(shape) in (4, 5) and order not in (NCHW, NCDHW) and len(order) == len(shape)) or \
        (len(shape) == 3 and order != NCW and len(order) == 3)  # tokens (nwc); a sequence (ncw) reads halos


def _split_flat(shape: Sequence[int], layout: Layout) -> list[int]:
    local = list(shape)
    if not local:  # a 0-D tensor (a mean of everything): whole
        return local
    local[0] = -(-local[0] // layout.n)
    local[-1] = -(-local[-1] // layout.c)
    return local


def _local_input(kind: str, shape: list[int], output: list[int], local_out: list[int], layout: Layout,
                 attrs: dict[str, Any], order: str = NCHW) -> list[int] | None:
    sequence = len(shape) == 3 and order == NCW and len(output) == 3
    volume = len(shape) == 5 and order == NCDHW and len(output) == 5
    if not (sequence or volume or len(shape) == 4):  # held flattened: split by samples
        local = list(shape)
        if local:  # a 0-D operand (a scalar tensor) is read whole
            local[0] = -(-local[0] // layout.n)
        return local
    channels = shape[1] if kind in DENSE_KINDS else -(-shape[1] // layout.c)
    if kind == "conv" and attrs.get("groups", 1) > 1:
        channels = -(-shape[1] // layout.c)
    local = [-(-shape[0] // layout.n), channels, *shape[2:]]
    for axis, parts in enumerate(_spatial_parts(layout, len(shape)), start=2):
        if parts > 1:
            extent = _input_extent(kind, shape[axis], output[axis], local_out[axis], parts, axis - 2, attrs)
            if extent is None:
                return None
            local[axis] = extent
    return local


def _input_extent(kind: str, extent_in: int, extent_out: int, local_out: int, parts: int, axis: int,
                  attrs: dict[str, Any]) -> int | None:
    if kind in _SPATIAL_WINDOW:
        k, s, d = (axis_value(attrs.get(name, default), axis) for name, default in
                   (("kernel_size", 1), ("stride", None), ("dilation", 1)))
        s = s or k  # pooling's stride defaults to its kernel
        needed = (local_out - 1) * s + d * (k - 1) + 1
        return needed if needed <= extent_in + sum(axis_pads(attrs, axis)) else None  # edge tiles read padding
    if kind == "conv_transpose":
        k, s, d = (axis_value(attrs.get(name, 1), axis) for name in ("kernel_size", "stride", "dilation"))
        halo = max(0, -(-(d * (k - 1) + 1 - s) // s))
        return -(-extent_in // parts) + halo
    if kind == "adaptive_avgpool":  # its windows' rows, one more where a window straddles two tiles
        return min(extent_in, -(-local_out * extent_in // extent_out) + 1)
    if kind == "upsample" and extent_out != extent_in:  # an input shorter than the tiles is read whole
        scaled = -(-local_out * extent_in // extent_out)
        return min(extent_in, scaled + (1 if attrs.get("mode") in ("bilinear", "bicubic") else 0))
    return -(-extent_in // parts)


def _tile_padding(pad: list[int], shape: Sequence[int], local_out: Sequence[int],
                  layout: Layout) -> tuple[list[int], list[int]]:
    """``F.pad`` on a tile: along a split axis the tile reads its output rows (its halo or its border's padding
    gathered), so it pads nothing there."""
    amounts, local = [*pad, 0, 0, 0, 0][:max(4, len(pad))], list(shape)
    for axis, parts in enumerate((layout.h, layout.w)):
        if parts > 1:
            first = 2 - 2 * axis  # F.pad lists the last dimension first: left, right, top, bottom
            amounts[first:first + 2] = [0, 0]
            local[2 + axis] = local_out[2 + axis]
    return amounts, local


def _pre_padded(shape: Any, attrs: dict[str, Any], layout: Layout) -> Any:
    """A convolution's local input with an asymmetric padding's extra rows (an even kernel's ``'same'``) on its
    unsplit axes, so that the symmetric padding before gives the local output."""
    if shape is None or len(shape) < 3 or not isinstance(attrs.get("padding"), str):
        return shape
    padded = list(shape)
    for axis, parts in enumerate(_spatial_parts(layout, len(shape))):
        before, after = axis_pads(attrs, axis)
        if parts == 1:
            padded[2 + axis] += after - before
    return padded


def _local_weight(weight: Sequence[int] | None, layout: Layout, kind: str, attrs: dict[str, Any]) -> list[int] | None:
    if not weight:
        return None
    local = list(weight)
    if layout.c > 1 and kind in DENSE_KINDS:
        axis = 1 if kind == "conv_transpose" else 0
        local[axis] = -(-local[axis] // layout.c)
    elif layout.c > 1 and kind in _CHANNEL_SPLIT:
        local[0] = -(-local[0] // layout.c)
    return local


def _unpad_split_dims(attrs: dict[str, Any], layout: Layout, rank: int = 4) -> dict[str, Any]:
    """The padding left to the local problem: none along split axes (the tile reads its halos instead); a string
    ``'same'`` as explicit amounts (the side before; :func:`_pre_padded` adds an even kernel's extra row)."""
    parts = _spatial_parts(layout, rank)
    padding = [axis_pads(attrs, axis)[0] if attrs.get("padding") is not None else 0 for axis in range(len(parts))]
    for axis, split in enumerate(parts):
        if split > 1:
            padding[axis] = 0
    return {**attrs, "padding": padding}


def _spatial_parts(layout: Layout, rank: int) -> tuple[int, ...]:
    """Parts along each spatial axis of a ``rank``-D tensor: ``h`` and ``w`` of an image, ``d``, ``h`` and ``w``
    of a volume, ``w`` of a sequence (its length; a 3-D value of other axes is split by samples only: the
    capability predicate refuses the rest)."""
    return layout.parts_of(rank)[2:] if rank in (3, 4, 5) else (1,) * max(rank - 2, 1)


def axis_value(value: Any, axis: int) -> Any:
    """One axis of a per-axis hyper-parameter given as an int or a list (``[3, 3]`` or ``3``)."""
    if isinstance(value, (list, tuple)):
        return value[axis] if axis < len(value) else value[-1]
    return value


def _freeze(value: object) -> object:
    return tuple(_freeze(v) for v in value) if isinstance(value, (list, tuple)) else value


def _text(value: object) -> str:
    if isinstance(value, tuple):
        return "(" + ",".join(_text(v) for v in value) + ")"
    return str(value)


def _numel(shape: Sequence[int] | None) -> int:
    total = 1
    for extent in shape or ():
        total *= extent
    return total
