"""The capability predicate's rules for volumes ``(N, C, D, H, W)`` split by depth, height or width
(``cost_models.capability.predicate`` documents them).

The runtime's spatial forms work on tiles of any rank (``runtime.spatial``: a
:class:`~runtime.spatial.TileGrid` over ``d × h × w``), but not every 2-D form
has its 3-D counterpart yet: a volume's tiles run convolution (any kernel,
stride, dilation, groups), transposed convolution,
max and average pooling (explicit padding, ``ceil_mode`` too), global average
pooling, nearest and trilinear upsampling by integer scales, batch-norm,
group-norm and instance-norm modules, concatenation not along a split
dimension, and element-wise layers; convolution padded in the reflect,
replicate or circular mode or by ``'same'`` gathers its padded rows as an
image's does (``runtime.borders``). ``F.pad``, adaptive pooling to more than one position, pixel shuffles
and softmax across tiles are refused on split volumes (they run under ``n``
and ``c`` splits, or unsplit).
"""

from __future__ import annotations

from cost_models.ir.layer import Layer
from cost_models.ir.orders import NCDHW
from cost_models.layout import Layout

__all__ = ["volume_refusal", "volume_refusal_applies"]

_IMAGE_ONLY_KINDS = {"pad": "F.pad", "pixel_shuffle": "a pixel shuffle", "softmax": "a softmax over the channels"}
_VOLUME_KINDS = frozenset({"conv", "conv_transpose", "maxpool", "avgpool", "adaptive_avgpool", "upsample",
                           "batchnorm", "norm", "cat"})


def volume_refusal_applies(layer: Layer, layout: Layout) -> bool:
    """Whether ``layer`` reads or makes a volume and ``layout`` splits it by depth, height or width."""
    shapes = [layer.output_shape, *layer.input_shapes]
    return layout.spatial > 1 and any(shape and not isinstance(shape[0], list) and len(shape) == 5
                                      for shape in shapes)


def volume_refusal(layer: Layer, layout: Layout) -> str | None:
    """Why the runtime cannot split ``layer`` of a volume by ``layout``'s depth, height or width (``None``: it can,
    or the rules of every rank decide: an element-wise layer, a view)."""
    kind, attrs = layer.kind, layer.attrs
    inputs = [shape for shape in layer.input_shapes if shape and not isinstance(shape[0], list)]
    orders = attrs.get("input_orders") or [""] * len(inputs)
    if kind in _VOLUME_KINDS and any(len(shape) == 5 and order != NCDHW for shape, order in zip(inputs, orders)):
        return "its 5-D input is not a volume (N, C, D, H, W) made by volume layers; split it by sample or channel"
    if kind in _IMAGE_ONLY_KINDS:
        return f"{_IMAGE_ONLY_KINDS[kind]} of a volume cannot be split by depth, height or width yet"
    if kind not in _VOLUME_KINDS:
        return None  # element-wise layers, views: the general rules
    if kind in ("maxpool", "avgpool") and "pads" in attrs:
        return "a volume's pooling padded as TensorFlow's 'SAME' cannot be split by depth, height or width"
    if kind == "adaptive_avgpool" and any(extent != 1 for extent in layer.output_shape[2:]):
        return "a volume's adaptive pooling splits by depth, height or width only to one position (global pooling)"
    if kind == "upsample" and attrs.get("mode", "nearest") not in ("nearest", "trilinear"):
        return "a volume's upsampling across tiles supports nearest and trilinear (align_corners=False) only"
    if kind == "norm" and attrs.get("norm") not in ("GroupNorm", "InstanceNorm3d"):
        return f"{attrs.get('norm', 'this norm')} of a volume cannot be split by depth, height or width"
    return None
