"""The capability predicate's rules for height/width splits (``cost_models.capability.predicate`` documents
them): halos, padding in every mode, resampling, group-norm, pixel shuffles — each kind's registered in
``SPATIAL_RULES`` (group-norm's and pixel shuffles' in ``CHANNEL_RULES`` too)."""

from __future__ import annotations

from functools import partial
from typing import Any

from cost_models.borders import axis_pads, gathered_halos, window_reads
from cost_models.capability.registry import CHANNEL_RULES, SPATIAL_RULES
from cost_models.errors import InputError
from cost_models.halo import adaptive_reads, axis_halos, partition, reads_beyond_neighbours
from cost_models.ir.kinds import LayerKind
from cost_models.ir.layer import Layer
from cost_models.layout import Layout

__all__ = ["norm_refusal", "shuffle_refusal", "spatial_refusal"]

_HALO_KINDS: frozenset[LayerKind] = frozenset({"conv", "maxpool", "avgpool"})


_TILED_INPUT_KINDS = _HALO_KINDS | {"conv_transpose", "upsample", "adaptive_avgpool", "pad"}  # read input tiles


_READ_WHOLE_WHEN_SHORT = frozenset({"upsample", "adaptive_avgpool"})  # fewer input rows than tiles: read whole


def spatial_refusal(layer: Layer, layout: Layout) -> str | None:
    kind, attrs = layer.kind, layer.attrs
    if kind == "conv" and (isinstance(attrs.get("padding"), str) or attrs.get("padding_mode", "zeros") != "zeros"):
        return _input_fit_refusal(layer, layout) or _border_refusal(layer, layout)
    if kind in ("maxpool", "avgpool") and "pads" in attrs:  # TensorFlow's 'SAME' (cost_models.ir.classify)
        if attrs.get("ceil_mode"):
            return "pooling padded as TensorFlow's 'SAME' in ceil mode cannot be split across tiles"
        return _input_fit_refusal(layer, layout) or _border_refusal(layer, layout)
    if isinstance(attrs.get("padding"), str):
        return f"a {kind} layer with padding {attrs['padding']!r} cannot be split across tiles"
    if attrs.get("return_indices"):
        return "pooling that returns its indices cannot be split across tiles"
    if kind == "avgpool" and attrs.get("divisor_override"):
        return "average pooling with a divisor override cannot be split across tiles"
    if kind in _TILED_INPUT_KINDS - _READ_WHOLE_WHEN_SHORT and (small := _input_fit_refusal(layer, layout)):
        return small
    return SPATIAL_RULES.refusal(layer, layout)  # the kind's own rule, registered below


@SPATIAL_RULES.register("softmax")
def _softmax_refusal(layer: Layer, layout: Layout) -> str | None:
    if layer.attrs.get("dim") not in (1, -3):
        return "softmax across tiles must be over the channels (dim=1)"
    return None


@SPATIAL_RULES.register("conv_transpose")
def _transposed_refusal(layer: Layer, layout: Layout) -> str | None:
    if layout.c > 1 and layer.attrs.get("groups", 1) > 1:
        return "a grouped transposed convolution cannot be split by channel"
    return None


def _tiles(layout: Layout, rank: int) -> tuple[tuple[int, str], ...]:
    """``(parts, name)`` of each spatial axis of a ``rank``-D tensor: rows and columns; slices too of a volume."""
    names = {5: ("slices", "rows", "columns"), 4: ("rows", "columns"), 3: ("columns",)}.get(rank, ())
    return tuple(zip(layout.parts_of(rank)[2:], names)) if names else ()


def _input_fit_refusal(layer: Layer, layout: Layout) -> str | None:
    """A layer reading tiles of its input needs a non-empty tile of it on every rank (not only of its output)."""
    shape = layer.input_shapes[0] if layer.input_shapes else None
    if not shape or len(shape) not in (3, 4, 5) or isinstance(shape[0], list):
        return None
    small = [f"{extent} {name}" for extent, (parts, name) in zip(shape[2:], _tiles(layout, len(shape)))
             if extent < parts]
    return (f"its input {tuple(shape)} is {', '.join(small)}: fewer than the {layout} tiles it would be read in"
            if small else None)


@SPATIAL_RULES.register(*_HALO_KINDS)
def _halo_refusal(layer: Layer, layout: Layout) -> str | None:
    attrs, shape = layer.attrs, layer.input_shapes[0]
    for axis, (parts, _) in enumerate(_tiles(layout, len(shape))):
        if parts == 1:
            continue
        kernel, stride, dilation, padding = (_axis(attrs.get(key, default), axis) for key, default in
                                             (("kernel_size", 1), ("stride", None), ("dilation", 1), ("padding", 0)))
        try:
            axis_halos(shape[2 + axis], parts, kernel, stride or kernel, dilation, padding,
                       bool(attrs.get("ceil_mode")))
        except InputError as err:
            return str(err)
    return None


@SPATIAL_RULES.register("upsample")
def _upsample_refusal(layer: Layer, layout: Layout) -> str | None:
    attrs = layer.attrs
    linear = {3: "linear", 4: "bilinear", 5: "trilinear"}.get(len(layer.output_shape))
    if attrs.get("mode", "nearest") not in ("nearest", linear) or attrs.get("align_corners"):
        return "upsampling across tiles supports nearest and (bi/tri)linear (align_corners=False) only"
    extents_in, extents_out = layer.input_shapes[0][2:], layer.output_shape[2:]
    if any(out % extent for extent, out in zip(extents_in, extents_out)):
        return (f"upsampling {'×'.join(map(str, extents_in))} to {'×'.join(map(str, extents_out))} is not an integer "
                f"scale")
    return None


@SPATIAL_RULES.register("adaptive_avgpool")
def _adaptive_refusal(layer: Layer, layout: Layout) -> str | None:
    """Adaptive average pooling's output tiles read their windows' rows; no tile may read past its neighbours'."""
    (_, _, *extents_in), (_, _, *extents_out) = layer.input_shapes[0], layer.output_shape
    tiles = _tiles(layout, len(extents_in) + 2)
    for extent_in, extent_out, (parts, name) in zip(extents_in, extents_out, tiles):
        if parts == 1 or extent_in < parts:  # an input shorter than the tiles is read whole
            continue
        if reads_beyond_neighbours(extent_in, extent_out, parts,
                                   partial(adaptive_reads, extent_in, extent_out)) is not None:
            return (f"a {parts}-way split of {extent_in} {name} is too fine for a window of adaptive pooling to "
                    f"{extent_out} {name}: a tile would read beyond its neighbours")
    return None


@SPATIAL_RULES.register("norm")
@CHANNEL_RULES.register("norm")
def norm_refusal(layer: Layer, layout: Layout) -> str | None:
    """Group-norm and instance-norm modules, and ``F.group_norm``, of ``(N, C, H, W)`` tensors split by channel,
    height and width: their statistics per sample and group are summed over the ranks holding the same samples
    (``runtime.norm``)."""
    attrs = layer.attrs
    function = attrs.get("function_form") and not (attrs.get("norm") == "GroupNorm"
                                                   and isinstance(attrs.get("num_groups"), int))
    if attrs.get("norm") not in ("GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d") or function:
        return (f"{attrs.get('norm', 'this norm')} cannot be split by channel or space yet (GroupNorm and "
                f"InstanceNorm1d/2d/3d modules and F.group_norm can)")
    if attrs.get("track_running_stats") or len(layer.input_shapes[0]) not in (3, 4, 5):
        return ("an instance-norm tracking running statistics, or of other than (N, C, L), (N, C, H, W) or "
                "(N, C, D, H, W), cannot be split by channel or space")
    return None


@SPATIAL_RULES.register("pad")
def _pad_refusal(layer: Layer, layout: Layout) -> str | None:
    """Constant padding of known amounts splits by height and width: each output tile reads its rows shifted by the
    padding before it, every tile at least one row of the input and none past its neighbours'."""
    attrs, shape = layer.attrs, layer.input_shapes[0]
    if not isinstance(attrs.get("pad"), list) or len(shape) != 4:
        return "a padding of amounts unknown when traced cannot be split across tiles"
    if attrs.get("mode", "constant") != "constant":
        return _border_refusal(layer, layout)
    for axis, parts in ((0, layout.h), (1, layout.w)):
        before, after = (attrs["pad"] + [0, 0, 0, 0])[2 - 2 * axis:4 - 2 * axis]
        if parts == 1 or before == after == 0:
            continue
        extent, padded = shape[2 + axis], shape[2 + axis] + before + after
        reads = [(o0 - before, o1 - before) for o0, o1 in partition(padded, parts)]
        beyond = reads_beyond_neighbours(extent, padded, parts, partial(_shifted, before))
        if before < 0 or after < 0 or beyond is not None or any(min(b, extent) <= max(a, 0) for a, b in reads):
            return (f"a {parts}-way split of {extent} {('rows', 'columns')[axis]} padded by {before} and {after} "
                    f"is too fine for a window: a tile would read past its neighbours, or padding only")
    return None


def _border_refusal(layer: Layer, layout: Layout) -> str | None:
    """A convolution padded in a mode (or asymmetrically: an even kernel's ``'same'``), or ``F.pad`` in reflect,
    replicate or circular mode: each tile gathers its windows' padded rows from itself and its neighbours (ring
    neighbours when circular; ``cost_models.borders``)."""
    attrs, shape = layer.attrs, layer.input_shapes[0]
    if layer.kind == "pad":
        mode, amounts = attrs.get("mode", "constant"), [*attrs["pad"], 0, 0, 0, 0][:4]
        if any(amount < 0 for amount in amounts):
            return f"{mode} padding by negative amounts {amounts} cannot be split across tiles"
        windows = [((1, 1, 1), (amounts[2], amounts[3])), ((1, 1, 1), (amounts[0], amounts[1]))]
    else:
        mode = attrs.get("padding_mode", "zeros")
        windows = [((_axis(attrs.get("kernel_size", 1), axis), _axis(attrs.get("stride", 1), axis),
                     _axis(attrs.get("dilation", 1), axis)), axis_pads(dict(attrs), axis))
                   for axis in range(len(shape) - 2)]
    for axis, (parts, _) in enumerate(_tiles(layout, len(shape))):
        if parts > 1:
            window, pads = windows[axis]
            try:
                gathered_halos(shape[2 + axis], window_reads(shape[2 + axis], parts, *window, pads), mode)
            except InputError as err:
                return str(err)
    return None


@SPATIAL_RULES.register("pixel_shuffle")
@CHANNEL_RULES.register("pixel_shuffle")
def shuffle_refusal(layer: Layer, layout: Layout) -> str | None:
    """Pixel (un)shuffle by ``r`` moves each ``r×r`` block of positions to ``r²`` channels and back: it runs on a
    box when every part of the coarse side, times ``r`` (``r²`` for the channels), is the part of the fine side."""
    attrs = layer.attrs
    factor = attrs.get("factor")
    if not isinstance(factor, int):
        return "a pixel shuffle of a factor computed from shapes cannot be split by channel or space"
    source, target = layer.input_shapes[0], layer.output_shape
    coarse, fine = (source, target) if not attrs.get("inverse") else (target, source)  # fine: more rows, fewer channels
    axes = ((1, layout.c, fine[1], coarse[1], factor * factor), (2, layout.h, coarse[2], fine[2], factor),
            (3, layout.w, coarse[3], fine[3], factor))
    for dim, parts, small, large, scale in axes:
        if parts > 1 and (small < parts or partition(large, parts) != [(scale * a, scale * b) for a, b in
                                                                        partition(small, parts)]):
            return (f"a {parts}-way split of {small} and {large} along dimension {dim} of a pixel shuffle by {factor} "
                    f"does not align its parts (give it an extent the parts divide)")
    return None


def _axis(value: Any, axis: int) -> Any:
    if isinstance(value, (list, tuple)):
        return value[axis] if axis < len(value) else (value[-1] if value else None)
    return value


def _shifted(before: int, first: int, stop: int) -> tuple[int, int]:
    """Output rows ``[first, stop)`` of a tile as the rows of the unpadded input they start at (``before`` rows of
    padding precede it)."""
    return first - before, stop - before
