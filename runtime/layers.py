"""Each layer kind's distributed form: what it reads, how it computes its box of the output.

A :class:`Site` is one layer of the plan as one rank sees it: its Layout, this
rank's member number, the ranks of its stage and the process groups. For each
kind, :func:`input_placement` says in which placement the layer reads its
tensor inputs (the executor redistributes them when they are held otherwise)
and :data:`HANDLERS` computes the layer's output box:

* convolution, transposed convolution, pooling (adaptive average pooling
  too) and upsampling split by height or width exchange halos
  (``runtime.spatial``, ``runtime.resample``);
* convolution, transposed convolution and linear layers split by ``c`` hold a
  slice of the filters and read every input channel (``Placement(L, "c")``);
  the adjoint of that redistribution sums the input gradients over the slices;
* self-attention (``nn.MultiheadAttention``) split by tokens reads its keys and
  values whole along the tokens (``w``), its queries in its own layout; split
  by heads (``c``), its input whole along the channels (``runtime.attention``);
* group-norm and instance-norm modules sum their statistics per sample and
  group over the tiles of the same samples (``runtime.norm.group_norm``);
* batch-norm sums its statistics over the tiles of the same samples and
  channels (``runtime.norm``) — over the whole batch when synchronised; as a
  module, or called as ``F.batch_norm`` with whole statistics, weight and bias
  (:func:`functional_batch_norm`: timm's ``BatchNormAct2d``);
* a global average pool of a spatially split input sums the tiles' sums over
  the tile group (``runtime.spatial.global_avg_pool2d``) instead of gathering;
* every other supported kind runs the user's own module or function on the
  local boxes, which is exact for element-wise layers and
  for layers that do not mix the split dimensions (checked by :func:`refusal`:
  ``cost_models.capability.predicate``'s predicate);
  a handler returns ``None`` to ask for that.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import torch
import torch.nn.functional as F
from torch import nn

from cost_models.borders import axis_pads
from cost_models.capability.predicate import layer_refusal
from cost_models.halo import partition
from cost_models.ir.layer import Layer
from cost_models.layout import Layout, axes_of
from runtime import borders, norm, resample, spatial
from runtime.attention import heads_attention
from runtime.collectives import all_reduce_sum
from runtime.groups import GroupCache, block_of
from runtime.placement import Placement, value_placement
from runtime.windows import window_attention

__all__ = ["HANDLERS", "FunctionalForm", "Site", "functional_batch_norm", "functional_conv", "functional_form",
           "functional_group_norm", "input_placement", "read_placement", "refusal"]

DENSE = frozenset({"conv", "conv_transpose", "linear"})
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_CONV_TRANSPOSES = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
_NORMS = (nn.GroupNorm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
_POOLS = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)
"""The module classes of the kinds with a distributed form (``cost_models.ir.classify`` kinds modules by them)."""


@dataclass(frozen=True)
class Site:
    """One layer as one rank sees it."""

    name: str
    kind: str
    layout: Layout
    layer: Layer  # the LayerGraph node: shapes, attrs
    module: nn.Module | None
    member: int
    ranks: tuple[int, ...]
    groups: GroupCache
    sync_batchnorm: bool
    row_form: bool = False  # a linear layer reading its input split as its own filters (cost_models.dense_forms)

    def block(self, kind: str, layout: Layout | None = None) -> tuple[int, ...]:
        """Global ranks of this rank's group of ``kind`` (``runtime.groups.blocks``) under ``layout``."""
        return tuple(self.ranks[q] for q in block_of(layout or self.layout, len(self.ranks), kind, self.member))

    def grid(self, layout: Layout | None = None) -> spatial.TileGrid:
        """This rank's tile grid under ``layout`` (default: the layer's), over the spatial axes of its input:
        ``(h, w)`` of an image, ``(d, h, w)`` of a volume, ``(w,)`` of a sequence."""
        layout = layout or self.layout
        parts = layout.parts_of(self.rank)[2:]
        return spatial.TileGrid.of_rank(parts, self.block("spatial", layout), self.ranks[self.member])

    @property
    def rank(self) -> int:
        """The number of dimensions of the layer's (first) input: 4 for an image, 5 for a volume."""
        shapes = self.layer.input_shapes or [self.layer.output_shape]
        return len(shapes[0])

    def input_hw(self, index: int = 0) -> tuple[int, ...]:
        """Global spatial extents of tensor input ``index``: height and width (depth first, of a volume)."""
        shape = self.layer.input_shapes[index]
        return tuple(int(extent) for extent in shape[2:])

    @property
    def placement(self) -> Placement:
        """Where the layer puts its output: its layout's grid, in the order of the value (``cost_models.ir.orders``)."""
        return value_placement(self.layout, self.layer)

    @property
    def spatial_split(self) -> bool:
        return self.layout.spatial > 1


def input_placement(site: Site) -> Placement:
    """The placement in which the layer reads its tensor inputs."""
    return Placement(site.layout) if site.row_form else read_placement(site.kind, site.layout)


def read_placement(kind: str, layout: Layout) -> Placement:
    """The placement in which a layer of ``kind`` under ``layout`` reads its tensor inputs."""
    if kind in DENSE and layout.c > 1:
        return Placement(layout, "c")
    return Placement(layout)


def refusal(site: Site) -> str | None:
    """Why this runtime cannot run the layer under its layout (``None`` when it can).

    The rules are ``cost_models.capability.predicate``'s, which the planner's candidates obey too.
    """
    return layer_refusal(site.layer, site.layout, sync_batchnorm=site.sync_batchnorm)


Fetch = Callable[[int, Placement], torch.Tensor]  # tensor input number -> its local box in a placement
Output = torch.Tensor | tuple[torch.Tensor, torch.Tensor | None] | None
"""What a handler returns: the layer's box of its output (an attention module's ``(out, None)``), or ``None``."""
FunctionalForm = Callable[["Site", Sequence[object], Mapping[str, object]], torch.Tensor | None]
"""The distributed form of a function call, given the call's own arguments (:func:`functional_form`)."""


def _conv(site: Site, fetch: Fetch) -> torch.Tensor | None:
    module = site.module
    x = fetch(0, input_placement(site))
    if module is None or (site.layout.c == 1 and not site.spatial_split):
        return None
    assert isinstance(module, _CONVS), f"layer '{site.name}' (conv) calls a {type(module).__name__}"
    groups = module.groups
    if site.layout.c > 1 and groups > 1:  # the slice's filters read only their groups' input channels
        start, stop = partition(x.shape[1], site.layout.c)[_channel_index(site)]
        x, groups = x[:, start:stop], groups // site.layout.c
    attrs, mode = site.layer.attrs, module.padding_mode
    if not site.spatial_split:
        if mode != "zeros" or "pads" in attrs:  # a mode, or TensorFlow's 'SAME' (module.padding is 0)
            padded = F.pad(x, _pad_list(attrs, x.dim() - 2), mode="constant" if mode == "zeros" else mode)
            return spatial.by_rank(spatial.CONV, x)(padded, module.weight, module.bias, module.stride, 0,
                                                    module.dilation, groups)
        return spatial.by_rank(spatial.CONV, x)(x, module.weight, module.bias, module.stride, module.padding,
                                                module.dilation, groups)
    if mode != "zeros" or isinstance(attrs["padding"], str):  # a mode, or an even kernel's 'same' (asymmetric)
        pads = tuple(axis_pads(attrs, axis) for axis in range(x.dim() - 2))
        return borders.padded_conv2d(x, module.weight, module.bias, site.grid(), site.input_hw(), module.stride,
                                     pads, module.dilation, groups, mode)
    return spatial.conv2d(x, module.weight, module.bias, site.grid(), site.input_hw(), module.stride,
                          attrs["padding"], module.dilation, groups)


def _pad_list(attrs: Mapping[str, object], axes: int = 2) -> list[int]:
    """``F.pad``'s amounts of a convolution's padding over ``axes`` spatial axes, the last axis first (left,
    right, top, bottom; then front, back of a volume)."""
    return [amount for axis in reversed(range(axes)) for amount in axis_pads(dict(attrs), axis)]


def _conv_transpose(site: Site, fetch: Fetch) -> torch.Tensor | None:
    module = site.module
    x = fetch(0, input_placement(site))
    if module is None or (site.layout.c == 1 and not site.spatial_split):
        return None
    assert isinstance(module, _CONV_TRANSPOSES), f"layer '{site.name}' (conv_transpose) calls a {type(module).__name__}"
    if not site.spatial_split:
        return spatial.by_rank(resample.CONV_TRANSPOSE, x)(x, module.weight, module.bias, module.stride, module.padding,
                                                           module.output_padding, module.groups, module.dilation)
    padding = module.padding
    assert not isinstance(padding, str), f"layer '{site.name}': a transposed convolution pads by amounts"
    return resample.conv_transpose2d(x, module.weight, module.bias, site.grid(), site.input_hw(), module.stride,
                                     padding, module.output_padding, module.dilation, module.groups)


def _linear(site: Site, fetch: Fetch) -> torch.Tensor | None:
    x = fetch(0, input_placement(site))
    module = site.module
    if module is None or site.layout.c == 1:
        return None
    if site.row_form:
        return _row_linear(site, x)
    assert isinstance(module, nn.Linear), f"layer '{site.name}' (linear) calls a {type(module).__name__}"
    return F.linear(x, module.weight, module.bias)


def _row_linear(site: Site, x: torch.Tensor) -> torch.Tensor:
    """Megatron-LM's row form (``cost_models.dense_forms``): this rank's input channels times its columns of the
    weight, summed over the ``c`` group; its part of the output channels, plus its part of the bias."""
    module = site.module
    assert isinstance(module, nn.Linear), f"layer '{site.name}' (linear) calls a {type(module).__name__}"
    summed = all_reduce_sum(F.linear(x, module.weight), site.groups.get(site.block("channels")))
    start, stop = partition(summed.shape[-1], site.layout.c)[_channel_index(site)]
    out, bias = summed.narrow(-1, start, stop - start), module.bias
    return out if bias is None else out + bias


def _batchnorm(site: Site, fetch: Fetch) -> torch.Tensor | None:
    module = site.module
    x = fetch(0, input_placement(site))
    if module is None:  # a function call: functional_batch_norm, with the call's own arguments
        return None
    assert isinstance(module, _BATCH_NORMS), f"layer '{site.name}' (batchnorm) calls a {type(module).__name__}"
    if not (module.training or module.running_mean is None) or len(_statistics_group(site)) == 1:
        return None  # the module itself, as written
    momentum = module.momentum
    if module.training and module.num_batches_tracked is not None:
        module.num_batches_tracked.add_(1)
        momentum = momentum if momentum is not None else 1.0 / float(module.num_batches_tracked)
    return _tiled_batch_norm(site, x, module.running_mean if module.training else None,
                             module.running_var if module.training else None, module.weight, module.bias,
                             momentum or 0.0, module.eps)


def functional_batch_norm(site: Site, args: Sequence[object], kwargs: Mapping[str, object]) -> torch.Tensor | None:
    """``F.batch_norm`` called by the program, on this rank's tile, with the call's own (whole) arguments.

    Its statistics are summed over the same group as the module form's; ``None`` when it needs no group
    (evaluation, or a group of one rank): the call then runs as written.
    """
    call = inspect.signature(F.batch_norm).bind(*args, **kwargs)
    call.apply_defaults()
    values = call.arguments
    if not values["training"]:
        return None
    return _tiled_batch_norm(site, values["input"], values["running_mean"], values["running_var"], values["weight"],
                             values["bias"], values["momentum"] or 0.0, values["eps"])


def _tiled_batch_norm(site: Site, x: torch.Tensor, running_mean: torch.Tensor | None,
                      running_var: torch.Tensor | None, weight: torch.Tensor | None, bias: torch.Tensor | None,
                      momentum: float, eps: float) -> torch.Tensor | None:
    """Training batch-norm of this tile with statistics over the tiles of its samples (all samples: synchronised)."""
    group = _statistics_group(site)
    if len(group) == 1:
        return None
    shape = site.layer.input_shapes[0]
    samples = shape[0] if site.sync_batchnorm else x.shape[0]  # the group holds every sample, or this rank's
    count = samples * math.prod(shape[2:])  # and every position of them
    return norm.batch_norm(x, running_mean, running_var, weight, bias, True, momentum, eps, site.groups.get(group),
                           count)


def _norm(site: Site, fetch: Fetch) -> torch.Tensor | None:
    """Group-norm and instance-norm modules over tiles and channel parts: statistics per sample and group over
    the ranks holding the same samples (a channel part's groups may straddle its bounds)."""
    x = fetch(0, input_placement(site))
    module = site.module
    if module is None or isinstance(module, nn.LayerNorm):
        # a LayerNorm of positions held whole (cost_models.capability.predicate); F.group_norm: apply's call
        return None
    assert isinstance(module, _NORMS), f"layer '{site.name}' (norm) calls a {type(module).__name__}"
    groups = module.num_groups if isinstance(module, nn.GroupNorm) else int(site.layer.input_shapes[0][1])
    return _tiled_group_norm(site, x, groups, module.weight, module.bias, module.eps)


def functional_group_norm(site: Site, args: Sequence[object], kwargs: Mapping[str, object]) -> torch.Tensor | None:
    """``F.group_norm`` called by the program (timm's ``GroupNorm1``) on this rank's box, its weight and bias given
    whole: :func:`_norm`'s form, with the call's own arguments."""
    call = inspect.signature(F.group_norm).bind(*args, **kwargs)
    call.apply_defaults()
    values = call.arguments
    return _tiled_group_norm(site, values["input"], values["num_groups"], values["weight"], values["bias"],
                             values["eps"])


def functional_form(site: Site, target: object) -> FunctionalForm | None:
    """The distributed form of a function call the program makes (``F.batch_norm``, ``F.group_norm``, a spatially
    split ``F.conv2d``), or ``None`` when the call runs as written on the local boxes."""
    if site.module is not None:
        return None
    if site.kind == "batchnorm":
        return functional_batch_norm
    if site.kind == "norm" and target is F.group_norm:
        return functional_group_norm
    if site.kind == "window_attention" and site.spatial_split:
        return functional_window_attention
    return functional_conv if site.kind == "conv" and site.spatial_split else None


def functional_window_attention(site: Site, args: Sequence[object], kwargs: Mapping[str, object]) -> torch.Tensor:
    """Swin's ``shifted_window_attention`` on this rank's tile of whole windows (``runtime.windows``)."""
    return window_attention(site.grid(), site.layer.input_shapes[0][1:3], args, kwargs)


_CONV_ARGUMENTS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_CONV_DEFAULTS = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}


def functional_conv(site: Site, args: Sequence[Any], kwargs: Mapping[str, Any]) -> torch.Tensor:
    """``F.conv2d`` called by the program with filters computed from parameters (timm's ``StdConv2d``,
    ``ScaledStdConv2d``) on this rank's tile (:func:`functional_form`: a spatial split): :func:`_conv`'s form with
    the call's own (whole) filters."""
    values = {**_CONV_DEFAULTS, **dict(zip(_CONV_ARGUMENTS, args)), **kwargs}
    x, weight, bias, stride, dilation = (values[k] for k in ("input", "weight", "bias", "stride", "dilation"))
    if isinstance(values["padding"], str):
        pads = (axis_pads(dict(site.layer.attrs), 0), axis_pads(dict(site.layer.attrs), 1))
        return borders.padded_conv2d(x, weight, bias, site.grid(), site.input_hw(), stride, pads, dilation,
                                     values["groups"], "zeros")
    return spatial.conv2d(x, weight, bias, site.grid(), site.input_hw(), stride, values["padding"], dilation,
                          values["groups"])


def _tiled_group_norm(site: Site, x: torch.Tensor, groups: int, weight: torch.Tensor | None,
                      bias: torch.Tensor | None, eps: float) -> torch.Tensor | None:
    if site.layout.c * site.layout.spatial == 1:
        return None  # one rank's samples whole: the call as written
    shape = site.layer.input_shapes[0]
    count = int(shape[1]) // groups * math.prod(shape[2:])
    first, stop = partition(int(shape[1]), site.layout.c)[_channel_index(site)] if site.layout.c > 1 else \
        (0, int(shape[1]))
    weight, bias = (None if p is None else p[first:stop] for p in (weight, bias))
    return norm.group_norm(x, groups, weight, bias, eps, site.groups.get(site.block("image")), count, first,
                           int(shape[1]))


def _statistics_group(site: Site) -> tuple[int, ...]:
    return site.block("samples" if site.sync_batchnorm else "spatial")


def _pool(site: Site, fetch: Fetch) -> torch.Tensor | None:
    x = fetch(0, input_placement(site))
    if not site.spatial_split:
        return None
    options = _pool_options(site)
    if "pads" in site.layer.attrs:  # TensorFlow's 'SAME': the tile's windows gathered with their pads
        return _tf_same_pool(site, x, options)
    if site.kind == "maxpool":
        return spatial.max_pool2d(x, site.grid(), site.input_hw(), options["kernel_size"], options["stride"],
                                  options["padding"], options["dilation"], options["ceil_mode"])
    return spatial.avg_pool2d(x, site.grid(), site.input_hw(), options["kernel_size"], options["stride"],
                              options["padding"], options["count_include_pad"], options["ceil_mode"])


def _tf_same_pool(site: Site, x: torch.Tensor, options: _PoolOptions) -> torch.Tensor:
    """timm's ``MaxPool2dSame`` / ``AvgPool2dSame`` on a tile: its windows' rows gathered, padded by ``−∞`` before a
    max and by zeros (counted) before an average, as the module pads the whole."""
    kernel, stride, dilation = (spatial.pair(options["kernel_size"]), spatial.pair(options["stride"]),
                                spatial.pair(options["dilation"]))
    pads = (axis_pads(dict(site.layer.attrs), 0), axis_pads(dict(site.layer.attrs), 1))
    fill = float("-inf") if site.kind == "maxpool" else 0.0
    local = borders.padded_tiles(x, site.grid(), site.input_hw(), pads, "constant",
                                 [(kernel[axis], stride[axis], dilation[axis]) for axis in (0, 1)], fill)
    if site.kind == "maxpool":
        return F.max_pool2d(local, kernel, stride, 0, dilation)
    return F.avg_pool2d(local, kernel, stride, 0)


def _upsample(site: Site, fetch: Fetch) -> torch.Tensor | None:
    if not site.spatial_split:
        return None
    whole = _short_axes(site)
    x = fetch(0, _reading_whole(site, whole))
    extents, outputs = site.input_hw(), site.layer.output_shape[2:]
    mode = site.layer.attrs.get("mode", "nearest")
    scales = tuple(int(out) // extent for out, extent in zip(outputs, extents))
    return resample.interpolate(x, site.grid(), extents, scales, mode, whole)


def _short_axes(site: Site) -> tuple[bool, ...]:
    """The split axes along which the input has fewer rows (columns) than tiles: it is read whole there."""
    return tuple(parts > 1 and extent < parts for extent, parts in zip(site.input_hw(), site.grid().parts))


def _reading_whole(site: Site, whole: tuple[bool, ...]) -> Placement:
    axes = axes_of(site.rank)[2:]
    return Placement(site.layout, "".join(axis for axis, short in zip(axes, whole) if short))


def _adaptive_avgpool(site: Site, fetch: Fetch) -> torch.Tensor | None:
    if not site.spatial_split:
        return None
    whole = _short_axes(site)
    x = fetch(0, _reading_whole(site, whole))
    output = site.layer.output_shape
    return resample.adaptive_avg_pool2d(x, site.grid(), site.input_hw(), (int(output[2]), int(output[3])), whole)


def _pad(site: Site, fetch: Fetch) -> torch.Tensor | None:
    attrs = site.layer.attrs
    if not site.spatial_split or not any((list(attrs["pad"]) + [0, 0, 0, 0])[:4]):  # channels' only: on the box
        return None
    x = fetch(0, input_placement(site))
    if attrs.get("mode", "constant") != "constant":
        return borders.padded_pad2d(x, site.grid(), site.input_hw(), attrs["pad"], attrs["mode"])
    return resample.pad2d(x, site.grid(), site.input_hw(), attrs["pad"], float(attrs.get("value") or 0.0))


class _PoolOptions(TypedDict):
    kernel_size: int | Sequence[int]
    stride: int | Sequence[int]
    padding: int | Sequence[int]
    dilation: int | Sequence[int]
    count_include_pad: bool
    ceil_mode: bool


def _pool_options(site: Site) -> _PoolOptions:
    if site.module is not None:
        module = site.module
        assert isinstance(module, _POOLS), f"layer '{site.name}' ({site.kind}) calls a {type(module).__name__}"
        return {"kernel_size": module.kernel_size, "stride": module.stride or module.kernel_size,
                "padding": module.padding, "dilation": getattr(module, "dilation", 1),
                "count_include_pad": getattr(module, "count_include_pad", True), "ceil_mode": module.ceil_mode}
    attrs = site.layer.attrs
    kernel = attrs["kernel_size"]
    return {"kernel_size": kernel, "stride": attrs.get("stride") or kernel, "padding": attrs.get("padding", 0),
            "dilation": attrs.get("dilation", 1), "count_include_pad": attrs.get("count_include_pad", True),
            "ceil_mode": bool(attrs.get("ceil_mode", False))}


def _channel_index(site: Site) -> int:
    from cost_models.redistribution import coordinates

    return coordinates(site.layout, site.member)[1]


def _attention(site: Site, fetch: Fetch) -> Output:
    """Self-attention split by tokens and heads: this rank's queries attend to every token — the keys and values
    read whole along ``w`` (an all-gather; its adjoint sums their gradients back onto each rank's tokens) — and,
    split by ``c``, with its heads only (``runtime.attention``). Returns the module's ``(out, None)``, or
    ``F.scaled_dot_product_attention``'s output."""
    layout = site.layout
    if layout.w == 1 and layout.c == 1:
        return None
    if site.module is None:  # F.scaled_dot_product_attention(q, k, v): split by tokens only
        keys, values = (fetch(index, Placement(layout, "w")) for index in (1, 2))
        return F.scaled_dot_product_attention(fetch(0, Placement(layout)), keys, values,
                                              scale=site.layer.attrs.get("scale"))
    module = site.module
    assert isinstance(module, nn.MultiheadAttention), f"layer '{site.name}' (attention) calls a {type(module).__name__}"
    queries = fetch(0, Placement(layout, "c"))
    every = fetch(0, Placement(layout, "cw")) if layout.w > 1 else queries
    if layout.c == 1:
        return module(queries, every, every, need_weights=False)
    return heads_attention(module, queries, every, layout, site.member, site.ranks,
                           site.layer.output_shape), None


HANDLERS: dict[str, Callable[[Site, Fetch], Output]] = {
    "conv": _conv, "conv_transpose": _conv_transpose, "linear": _linear, "batchnorm": _batchnorm, "norm": _norm,
    "maxpool": _pool, "avgpool": _pool, "adaptive_avgpool": _adaptive_avgpool, "upsample": _upsample, "pad": _pad,
    "attention": _attention,
}
"""Kinds with a distributed form. A handler returns ``None`` when the layer needs none here (unsplit in the
way that matters): the executor then runs the user's module or function on the local boxes."""
