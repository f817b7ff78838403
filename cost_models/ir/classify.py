"""What kind of layer an fx node is, and the attributes its cost depends on.

Tracing turns every tensor-producing fx node into a layer; this module names
its kind (``conv``, ``batchnorm``, ``maxpool``, ``add``, ``cat``, ...) and
extracts the hyper-parameters later cost models need (kernel, stride,
padding, dilation, groups for halo widths; ``dim`` for concatenation; scale
for upsampling). Kinds not listed here become ``other``: they are still
traced, shaped and costed per element, and ``parplan inspect`` shows them.

A module kept opaque (``--leaf-module``, or automatically by tracing when
torch.fx cannot trace it) is ``other`` unless it computes exactly what its
``torch.nn`` class does: a subclass with a forward of its own (timm's
``Conv2dSame`` pads dynamically) is not that layer, and an automatically
opaque module is ``other`` whatever its class, marked ``opaque: automatic``
in its attributes. The capability predicate runs ``other`` layers under a
sample split only.
"""

from __future__ import annotations

import operator
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import GraphModule, Node
from torch.fx.node import _get_qualified_name

from cost_models.ir.functionalize import selects_samples, view_of_write, write_into
from cost_models.ir.kinds import VIEW_KINDS, LayerKind

__all__ = ["KindInfo", "classify"]

_CONV_FIELDS = ("kernel_size", "stride", "padding", "dilation", "groups", "padding_mode")
_POOL_FIELDS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices",
                "count_include_pad", "divisor_override")
_PAIR_FIELDS = ("kernel_size", "stride", "padding", "dilation")

_MODULE_KINDS: tuple[tuple[type[nn.Module] | tuple[type[nn.Module], ...], LayerKind], ...] = (
    ((nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d), "conv_transpose"),
    ((nn.Conv1d, nn.Conv2d, nn.Conv3d), "conv"),
    (nn.Linear, "linear"),
    (nn.MultiheadAttention, "attention"),
    ((nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm), "batchnorm"),
    ((nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d), "norm"),
    ((nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d), "maxpool"),
    ((nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d), "avgpool"),
    ((nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d), "adaptive_avgpool"),
    ((nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d), "adaptive_maxpool"),
    ((nn.Upsample, nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d), "upsample"),
    ((nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout), "dropout"),
    ((nn.Softmax, nn.LogSoftmax), "softmax"),
    ((nn.ZeroPad2d, nn.ConstantPad2d, nn.ReflectionPad2d, nn.ReplicationPad2d, nn.CircularPad2d), "pad"),
    ((nn.PixelShuffle, nn.PixelUnshuffle), "pixel_shuffle"),
    (nn.Flatten, "flatten"),
    (nn.Identity, "identity"),
    (
        (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Hardswish,
         nn.Hardsigmoid, nn.Hardtanh, nn.Mish, nn.PReLU, nn.Softplus),
        "activation",
    ),
)

_FUNCTION_KINDS: dict[object, LayerKind] = {
    operator.add: "add", operator.iadd: "add", torch.add: "add",
    operator.mul: "mul", operator.imul: "mul", torch.mul: "mul",
    operator.sub: "elementwise", operator.truediv: "elementwise", torch.sub: "elementwise",
    operator.isub: "elementwise", operator.itruediv: "elementwise", operator.neg: "elementwise",
    operator.pow: "elementwise", torch.pow: "elementwise", torch.div: "elementwise", torch.neg: "elementwise",
    torch.exp: "elementwise", torch.sqrt: "elementwise", torch.rsqrt: "elementwise", torch.square: "elementwise",
    torch.abs: "elementwise", torch.clamp: "elementwise", torch.clip: "elementwise", torch.erf: "elementwise",
    F.hardsigmoid: "activation", F.hardtanh: "activation", F.elu: "activation", F.mish: "activation",
    F.softplus: "activation", F.relu_: "activation", torch.relu_: "activation",
    torch.cat: "cat", torch.concat: "cat",
    torch.flatten: "flatten", torch.reshape: "view", operator.getitem: "getitem",
    F.relu: "activation", F.relu6: "activation", F.gelu: "activation", F.silu: "activation",
    F.hardswish: "activation", F.leaky_relu: "activation", torch.relu: "activation",
    torch.sigmoid: "activation", torch.tanh: "activation", F.sigmoid: "activation",
    F.conv2d: "conv", F.conv1d: "conv", F.conv3d: "conv", F.linear: "linear",
    F.scaled_dot_product_attention: "attention",
    F.batch_norm: "batchnorm",
    F.max_pool2d: "maxpool", F.avg_pool2d: "avgpool",
    F.adaptive_avg_pool2d: "adaptive_avgpool", F.adaptive_max_pool2d: "adaptive_maxpool",
    F.interpolate: "upsample", F.dropout: "dropout", F.softmax: "softmax", F.log_softmax: "softmax",
    F.dropout1d: "dropout", F.dropout2d: "dropout", F.dropout3d: "dropout", F.alpha_dropout: "dropout",
    F.feature_alpha_dropout: "dropout",
    F.pad: "pad", torch.softmax: "softmax", torch.log_softmax: "softmax",
    F.layer_norm: "norm", F.group_norm: "norm", F.instance_norm: "norm",
    F.pixel_shuffle: "pixel_shuffle", F.pixel_unshuffle: "pixel_shuffle",
    torch.permute: "view", torch.transpose: "view", torch.swapaxes: "view", torch.swapdims: "view",
    torch.movedim: "view", torch.moveaxis: "view",
    torch.mean: "mean",
}

_QUALIFIED_KINDS: dict[str, LayerKind] = {
    "torchvision.ops.stochastic_depth.stochastic_depth": "dropout",  # ConvNeXt, Swin, EfficientNet: per-sample masks
    "torchvision.models.swin_transformer.shifted_window_attention": "window_attention",  # Swin v1 and v2
}
"""Functions of other packages, by qualified name (this module does not import them)."""

_METHOD_KINDS: dict[str, LayerKind] = {
    "view": "view", "reshape": "view", "flatten": "flatten", "contiguous": "view",
    "permute": "view", "transpose": "view", "squeeze": "view", "unsqueeze": "view", "expand": "view",
    "relu": "activation", "relu_": "activation", "sigmoid": "activation",
    "add": "add", "add_": "add", "mul": "mul", "mul_": "mul", "mean": "mean",
    "sub": "elementwise", "sub_": "elementwise", "div": "elementwise", "div_": "elementwise",
    "pow": "elementwise", "neg": "elementwise", "exp": "elementwise", "sqrt": "elementwise",
    "rsqrt": "elementwise", "square": "elementwise", "abs": "elementwise", "clamp": "elementwise",
    "clamp_": "elementwise", "clip": "elementwise", "tanh": "activation", "sigmoid_": "activation",
    "softmax": "softmax", "log_softmax": "softmax",
}


@dataclass(frozen=True)
class KindInfo:
    """A node's kind, a label for what it calls, its attributes and whether it aliases its input."""

    kind: LayerKind
    target: str
    attrs: dict[str, Any] = field(default_factory=dict)
    aliases_input: bool = False


def classify(node: Node, root: GraphModule, *, opaque: Collection[str] = ()) -> KindInfo:
    """Kind, target label and cost-relevant attributes of one fx node.

    Args:
        opaque: Qualified names of the modules tracing kept opaque automatically: ``other`` whatever their class.
    """
    if node.op == "placeholder":
        return KindInfo("input", str(node.target))
    if node.op == "call_module":
        module = root.get_submodule(str(node.target))
        if str(node.target) in opaque:
            return KindInfo("other", _module_label(module), {"opaque": "automatic", **_held_norms(module)},
                            bool(getattr(module, "inplace", False)))
        info = _classify_module(module)
        return replace(info, attrs={**info.attrs, "masked": _masked(node)}) if info.kind == "attention" else info
    if node.op == "call_method":
        kind = _METHOD_KINDS.get(str(node.target), "other")
        return KindInfo(kind, f"Tensor.{node.target}", _function_attrs(node, root, kind),
                        kind in VIEW_KINDS or str(node.target).endswith("_"))
    label = _get_qualified_name(node.target) if callable(node.target) else str(node.target)
    kind = _FUNCTION_KINDS.get(node.target) or _QUALIFIED_KINDS.get(label, "other")
    if node.target is torch.as_tensor:  # of a tensor: the tensor itself; with a dtype or device, a cast
        kind = "identity" if len(node.args) == 1 and not node.kwargs else "elementwise"
    aliases = kind in VIEW_KINDS or node.target in (operator.iadd, operator.imul) or bool(node.kwargs.get("inplace"))
    return KindInfo(kind, label, _function_attrs(node, root, kind), aliases)


TF_SAME: dict[str, LayerKind] = {"timm.layers.conv2d_same.Conv2dSame": "conv",
                                 "timm.layers.pool2d_same.MaxPool2dSame": "maxpool",
           "timm.layers.pool2d_same.AvgPool2dSame": "avgpool"}
"""Convolutions and pooling that pad as TensorFlow's ``'SAME'`` (``timm``'s ``tf_*``, NASNet and PNASNet models): the
padding a function of the input's extent, ``max((⌈i/s⌉ − 1)·s + d·(k − 1) + 1 − i, 0)``, the extra row after (zeros;
``−∞`` before a max). Traced as leaves of their kind with ``padding='tf_same'``; the tracer records the pads
(``attrs["pads"]``)."""


def tf_same_pads(attrs: dict[str, Any], extents: list[int]) -> list[list[int]]:
    """``(before, after)`` per axis of a TensorFlow-'SAME' window over ``extents`` (:data:`TF_SAME`)."""
    pads = []
    for axis, extent in enumerate(extents):
        kernel, stride, dilation = (_per_axis(attrs.get(name) or 1, axis)
                                    for name in ("kernel_size", "stride", "dilation"))
        total = max((-(-extent // stride) - 1) * stride + dilation * (kernel - 1) + 1 - extent, 0)
        pads.append([total // 2, total - total // 2])
    return pads


def _per_axis(value: Any, axis: int) -> int:
    return int(value[axis] if isinstance(value, (list, tuple)) else value)


def _classify_module(module: nn.Module) -> KindInfo:
    if _module_label(module) in TF_SAME:
        kind = TF_SAME[_module_label(module)]
        return KindInfo(kind, _module_label(module), {**_module_attrs(module, kind), "padding": "tf_same"})
    kind = _module_kind(module)
    attrs = _module_attrs(module, kind) if kind != "other" else {**_module_attrs(module, kind), **_held_norms(module)}
    return KindInfo(kind, _module_label(module), attrs, kind in VIEW_KINDS or bool(getattr(module, "inplace", False)))


def _masked(node: Node) -> bool:
    """Whether an ``nn.MultiheadAttention`` call passes a mask (``key_padding_mask``, ``attn_mask``, causal)."""
    given = dict(zip(("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask"), node.args))
    given.update(node.kwargs)
    return any(given.get(name) is not None for name in ("key_padding_mask", "attn_mask")) or \
        bool(given.get("is_causal"))


def _held_norms(module: nn.Module) -> dict[str, int]:
    """An opaque module's batch-norms (its own statistics, which no split can synchronise): ``batch_norms``."""
    count = sum(isinstance(sub, nn.modules.batchnorm._BatchNorm) for sub in module.modules())
    return {"batch_norms": count} if count else {}


def _module_kind(module: nn.Module) -> LayerKind:
    """The kind of the first ``torch.nn`` class ``module`` is an instance of, if it runs that class's forward."""
    for types, name in _MODULE_KINDS:
        base = next((t for t in (types if isinstance(types, tuple) else (types,)) if isinstance(module, t)), None)
        if base is not None:
            return name if type(module).forward is base.forward else "other"
    return "other"


def _module_label(module: nn.Module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


_POOL_DEFAULTS = {"padding": 0, "dilation": 1, "ceil_mode": False, "return_indices": False,
                  "count_include_pad": True, "divisor_override": None}
_PAD_MODES = {"ZeroPad2d": "constant", "ConstantPad2d": "constant", "ReflectionPad2d": "reflect",
              "ReplicationPad2d": "replicate", "CircularPad2d": "circular"}


def _module_attrs(module: nn.Module, kind: str) -> dict[str, Any]:
    if kind in ("conv", "conv_transpose"):
        attrs = {name: _jsonable(getattr(module, name)) for name in _CONV_FIELDS}
        if isinstance(attrs["padding"], str):
            attrs["padding_spec"], attrs["padding"] = attrs["padding"], explicit_padding(attrs)
        attrs["transposed"] = kind == "conv_transpose"
        attrs["bias"] = module.bias is not None
        if kind == "conv_transpose":
            attrs["output_padding"] = _jsonable(module.output_padding)
        return attrs
    if kind in ("maxpool", "avgpool"):
        attrs = {name: _jsonable(getattr(module, name, _POOL_DEFAULTS.get(name))) for name in _POOL_FIELDS}
        return _pool_defaults(attrs)
    if kind in ("adaptive_avgpool", "adaptive_maxpool"):
        return {"output_size": _jsonable(module.output_size),
                "return_indices": bool(getattr(module, "return_indices", False))}
    if kind == "upsample":
        return {name: _jsonable(getattr(module, name)) for name in ("scale_factor", "size", "mode", "align_corners")}
    if kind == "batchnorm":
        return {"eps": module.eps, "affine": module.affine, "track_running_stats": module.track_running_stats}
    if kind == "norm":
        return _norm_attrs(module)
    if kind == "pad":
        return {"pad": _jsonable(module.padding), "mode": _PAD_MODES[type(module).__name__],
                "value": float(getattr(module, "value", 0.0))}
    if kind == "softmax":
        return {"dim": module.dim}
    if kind == "attention":
        return {"form": "module", "embed_dim": module.embed_dim, "num_heads": module.num_heads, "kdim": module.kdim,
                "vdim": module.vdim, "batch_first": bool(module.batch_first),
                "dropout": float(cast(float, module.dropout)),
                "extra_keys": module.bias_k is not None or bool(module.add_zero_attn)}
    if kind == "pixel_shuffle":
        inverse = isinstance(module, nn.PixelUnshuffle)
        return {"factor": module.downscale_factor if inverse else module.upscale_factor, "inverse": inverse}
    if kind == "flatten":
        return {"start_dim": module.start_dim, "end_dim": module.end_dim}
    if kind == "activation":
        return {"function": type(module).__name__}
    rate = getattr(module, "p", None)
    if kind == "dropout" and isinstance(rate, (int, float)):
        return {"p": float(rate)}
    return {}


def _norm_attrs(module: nn.Module) -> dict[str, object]:
    attrs: dict[str, object] = {"norm": type(module).__name__, "eps": module.eps}
    if isinstance(module, nn.GroupNorm):
        attrs.update(num_groups=module.num_groups, affine=module.affine)
    elif isinstance(module, nn.LayerNorm):
        attrs.update(normalized_shape=list(module.normalized_shape), affine=module.elementwise_affine)
    else:
        attrs.update(affine=module.affine, track_running_stats=module.track_running_stats)
    return attrs


def explicit_padding(attrs: dict[str, Any]) -> Any:
    """A convolution's ``padding='valid'``, or ``'same'`` when it pads both sides alike (an even reach
    ``dilation·(kernel−1)``: every odd kernel), as the explicit padding PyTorch applies; an asymmetric ``'same'``
    stays the string (PyTorch pads it one row more at the end)."""
    kernel, dilation = attrs["kernel_size"], attrs["dilation"]
    if attrs["padding"] == "valid":
        return [0 for _ in kernel]
    reach = [d * (k - 1) for k, d in zip(kernel, dilation)]
    return [r // 2 for r in reach] if all(r % 2 == 0 for r in reach) else attrs["padding"]


def _pool_defaults(attrs: dict[str, Any]) -> dict[str, Any]:
    """Pooling attributes with PyTorch's defaults filled in: no stride (``None`` or ``[]``) means the kernel's."""
    attrs = {**{k: v for k, v in _POOL_DEFAULTS.items()}, **{k: v for k, v in attrs.items() if v is not None}}
    if attrs.get("stride") in (None, [], 0):
        attrs["stride"] = attrs["kernel_size"]
    return attrs


_FUNCTION_FIELDS: dict[str, tuple[str, ...]] = {
    "cat": ("dim",),
    "flatten": ("start_dim", "end_dim"),
    "maxpool": _POOL_FIELDS,
    "avgpool": _POOL_FIELDS,
    "adaptive_avgpool": ("output_size",),
    "adaptive_maxpool": ("output_size", "return_indices"),
    "upsample": ("size", "scale_factor", "mode", "align_corners"),
    "conv": ("stride", "padding", "dilation", "groups"),
    "batchnorm": ("training", "momentum", "eps"),
    "softmax": ("dim",),
    "pad": ("pad", "mode", "value"),
    "norm": ("normalized_shape", "num_groups", "eps", "use_input_stats"),
    "dropout": ("p",),
    "attention": ("dropout_p", "is_causal", "scale"),
    "window_attention": ("window_size", "shift_size", "num_heads", "attention_dropout", "dropout"),
}
_FUNCTION_NORMS = {"layer_norm": "LayerNorm", "group_norm": "GroupNorm", "instance_norm": "InstanceNorm"}
_FUNCTION_DEFAULTS: dict[str, dict[str, object]] = {
    "conv": {"stride": 1, "padding": 0, "dilation": 1, "groups": 1},
    "upsample": {"mode": "nearest", "align_corners": None},
    "pad": {"mode": "constant", "value": 0.0},
    "flatten": {"start_dim": 0, "end_dim": -1},
    "attention": {"form": "sdpa", "dropout_p": 0.0, "is_causal": False},
}


def _function_attrs(node: Node, root: GraphModule, kind: str) -> dict[str, Any]:
    """Attributes of a function or method call, read as its module form's are (defaults filled in).

    ``function: true`` marks the form: the runtime splits some kinds only as modules (capability predicate).
    """
    kwargs = _call_kwargs(node, root)
    wanted = _FUNCTION_FIELDS.get(kind, ())
    attrs = dict(_FUNCTION_DEFAULTS.get(kind, {}))
    attrs.update({name: _jsonable(kwargs[name]) for name in wanted if name in kwargs and not _has_node(kwargs[name])})
    if kind == "cat" and "dim" not in attrs:
        attrs["dim"] = int(node.args[1]) if len(node.args) > 1 and isinstance(node.args[1], int) else 0
    if kind in ("maxpool", "avgpool") and "kernel_size" in attrs:
        attrs = _pool_defaults(attrs)
    if kind == "conv":
        attrs.update(padding_mode="zeros", transposed=False)
    if kind == "upsample" and _has_node(kwargs.get("size")):
        attrs["size"] = None  # computed from tensor shapes: the traced output shape says what it was
    if kind == "activation":
        attrs["function"] = getattr(node.target, "__name__", str(node.target))
    if kind == "pixel_shuffle":
        inverse = node.target is F.pixel_unshuffle
        factor = kwargs.get("downscale_factor" if inverse else "upscale_factor",
                            node.args[1] if len(node.args) > 1 else None)
        attrs.update(factor=factor if isinstance(factor, int) else None, inverse=inverse)
    if kind == "norm" and node.op == "call_function":
        attrs["norm"] = _FUNCTION_NORMS.get(getattr(node.target, "__name__", ""), str(node.target))
    if kind == "getitem":
        attrs.update(_index_attrs(node))
    if node.target in (write_into, view_of_write):
        attrs["selects_samples"] = selects_samples(node)
    if kind == "attention":  # F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
        mask = kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
        attrs["masked"] = mask is not None or bool(kwargs.get("is_causal", False))
    if kind == "window_attention":  # torchvision's Swin: cosine attention (v2) when given a logit scale
        attrs["cosine"] = kwargs.get("logit_scale") is not None
    if kind == "other":
        attrs.update(_pieces_attrs(node) or _stack_attrs(node) or _reduce_attrs(node) or _merging_attrs(node))
    if kind in _FUNCTION_FIELDS or kind in ("linear", "dropout", "norm"):
        attrs["function_form"] = True
    return attrs


def _index_attrs(node: Node) -> dict[str, object]:
    """``sliced_dims`` of a tensor's ``x[s0, s1, …]`` made of slices with constant bounds only (each keeps its
    dimension in place): the dimensions whose slice is not ``:``. Nothing for another index (ints, ``None``,
    ``...``, tensors, bounds computed from shapes)."""
    if len(node.args) != 2 or not isinstance(node.args[0], Node):
        return {}
    index = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
    if not all(isinstance(entry, slice) and not _has_node([entry.start, entry.stop, entry.step]) for entry in index):
        return {}  # bounds computed from shapes (``x[:, :H]``) may read a split extent: kept as before
    return {"sliced_dims": [dim for dim, entry in enumerate(index) if entry != slice(None)]}


_PIECES = frozenset({"chunk", "split", "tensor_split", "torch.chunk", "torch.split", "torch.tensor_split",
                     "torch.functional.split", "unbind", "torch.unbind"})
"""Calls that cut a tensor into pieces along one dimension (``x.chunk(2, dim=1)``, ``torch.split(x, w, 1)``)."""


def _pieces_attrs(node: Node) -> dict[str, object]:
    """For a call that cuts a tensor into pieces along one dimension: ``pieces_along`` (that dimension, as
    written) and ``items_only`` (whether the program reads the pieces only by ``pieces[i]``)."""
    name = str(node.target) if node.op == "call_method" else (
        _get_qualified_name(node.target) if callable(node.target) else "")
    if name not in _PIECES or not node.args or not isinstance(node.args[0], Node):
        return {}
    drops = name.endswith("unbind")  # x.unbind(dim): the pieces lose that dimension (timm's q, k, v)
    position = 1 if drops else 2
    dim = node.kwargs.get("dim", node.args[position] if len(node.args) > position else 0)
    if not isinstance(dim, int):
        return {}
    items_only = all(user.op == "call_function" and user.target is operator.getitem and len(user.args) == 2
                     and isinstance(user.args[1], int) for user in node.users)
    return {"pieces_along": dim, "items_only": items_only, **({"pieces_drop": True} if drops else {})}


def _merging_attrs(node: Node) -> dict[str, object]:
    """``patch_merging``: torchvision's Swin ``_patch_merging_pad`` — each 2×2 patch of an ``(N, H, W, C)`` map
    concatenated into ``(N, H/2, W/2, 4C)`` (odd extents padded at the end first)."""
    label = _get_qualified_name(node.target) if node.op == "call_function" and callable(node.target) else ""
    return {"patch_merging": True} if label == "torchvision.models.swin_transformer._patch_merging_pad" else {}


def _stack_attrs(node: Node) -> dict[str, object]:
    """``stack_dim`` of ``torch.stack(tensors, dim)``: where the new dimension goes (0 puts it before the samples)."""
    if node.op != "call_function" or node.target is not torch.stack:
        return {}
    dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0)
    return {"stack_dim": dim} if isinstance(dim, int) else {}


_REDUCTIONS = frozenset({"sum", "prod", "amax", "amin", "logsumexp", "std", "var"})


def _reduce_attrs(node: Node) -> dict[str, object]:
    """``reduces``: the dimensions written in ``x.sum(0)``, ``torch.amax(x, dim=(0, 2))`` and the like."""
    name = str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", "")
    if name not in _REDUCTIONS or not node.args or not isinstance(node.args[0], Node):
        return {}
    dims = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    dims = [dims] if isinstance(dims, int) else dims
    if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) for d in dims):
        return {}
    keep = node.kwargs.get("keepdim", node.args[2] if len(node.args) > 2 and name != "logsumexp" else False)
    return {"reduces": list(dims), "keepdim": bool(keep) if isinstance(keep, bool) else None}


_CONV_CALLS = (F.conv2d, torch.conv2d, F.conv1d, F.conv3d)
_CONV_ARGUMENTS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


def _call_kwargs(node: Node, root: GraphModule) -> dict[str, Any]:
    """The call's arguments by name: fx's normalisation (with defaults) where it knows the signature."""
    if node.op == "call_function":
        try:
            normalized = node.normalized_arguments(root, normalize_to_only_use_kwargs=True)
        except Exception:  # noqa: BLE001 - fx cannot match some overloads; fall back to what was written
            normalized = None
        if normalized is not None:
            return dict(normalized.kwargs)
        if node.target in _CONV_CALLS:  # a builtin with overloads (padding a number or a string): fx cannot match
            return {**dict(zip(_CONV_ARGUMENTS, node.args)), **node.kwargs}
    if node.op == "call_method" and str(node.target) in _METHOD_ARGUMENTS:  # x.flatten(-2): positional
        return {**dict(zip(_METHOD_ARGUMENTS[str(node.target)], node.args[1:])), **node.kwargs}
    return dict(node.kwargs)


_METHOD_ARGUMENTS = {"softmax": ("dim",), "log_softmax": ("dim",), "flatten": ("start_dim", "end_dim")}


def _has_node(value: object) -> bool:
    if isinstance(value, Node):
        return True
    return isinstance(value, (tuple, list)) and any(_has_node(v) for v in value)


def _jsonable(value: object) -> object:
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return str(value)
