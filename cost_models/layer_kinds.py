"""What kind of layer an fx node is, and the attributes its cost depends on.

Tracing turns every tensor-producing fx node into a layer; this module names
its kind (``conv``, ``batchnorm``, ``maxpool``, ``add``, ``cat``, ...) and
extracts the hyper-parameters later cost models need (kernel, stride,
padding, dilation, groups for halo widths; ``dim`` for concatenation; scale
for upsampling). Kinds not listed here become ``other``: they are still
traced, shaped and costed per element, and ``parplan inspect`` shows them.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import GraphModule, Node
from torch.fx.node import _get_qualified_name

__all__ = ["KindInfo", "VIEW_KINDS", "classify"]

VIEW_KINDS = frozenset({"flatten", "view", "getitem", "identity"})
"""Kinds whose output aliases their input: they move no data and cost no time."""

_CONV_FIELDS = ("kernel_size", "stride", "padding", "dilation", "groups", "padding_mode")
_POOL_FIELDS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")

_MODULE_KINDS: tuple[tuple[type[nn.Module] | tuple[type[nn.Module], ...], str], ...] = (
    ((nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d), "conv_transpose"),
    ((nn.Conv1d, nn.Conv2d, nn.Conv3d), "conv"),
    (nn.Linear, "linear"),
    ((nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm), "batchnorm"),
    ((nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d), "norm"),
    ((nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d), "maxpool"),
    ((nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d), "avgpool"),
    ((nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d), "adaptive_avgpool"),
    ((nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d), "adaptive_maxpool"),
    ((nn.Upsample, nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d), "upsample"),
    ((nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout), "dropout"),
    ((nn.Softmax, nn.LogSoftmax), "softmax"),
    (nn.Flatten, "flatten"),
    (nn.Identity, "identity"),
    (
        (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Hardswish,
         nn.Hardsigmoid, nn.Hardtanh, nn.Mish, nn.PReLU, nn.Softplus),
        "activation",
    ),
)

_FUNCTION_KINDS: dict[Callable[..., Any], str] = {
    operator.add: "add", operator.iadd: "add", torch.add: "add",
    operator.mul: "mul", operator.imul: "mul", torch.mul: "mul",
    operator.sub: "elementwise", operator.truediv: "elementwise", torch.sub: "elementwise",
    torch.cat: "cat", torch.concat: "cat",
    torch.flatten: "flatten", torch.reshape: "view", operator.getitem: "getitem",
    F.relu: "activation", F.relu6: "activation", F.gelu: "activation", F.silu: "activation",
    F.hardswish: "activation", F.leaky_relu: "activation", torch.relu: "activation",
    torch.sigmoid: "activation", torch.tanh: "activation", F.sigmoid: "activation",
    F.conv2d: "conv", F.conv1d: "conv", F.conv3d: "conv", F.linear: "linear",
    F.batch_norm: "batchnorm",
    F.max_pool2d: "maxpool", F.avg_pool2d: "avgpool",
    F.adaptive_avg_pool2d: "adaptive_avgpool", F.adaptive_max_pool2d: "adaptive_maxpool",
    F.interpolate: "upsample", F.dropout: "dropout", F.softmax: "softmax", F.log_softmax: "softmax",
    torch.mean: "mean",
}

_METHOD_KINDS: dict[str, str] = {
    "view": "view", "reshape": "view", "flatten": "flatten", "contiguous": "view",
    "permute": "view", "transpose": "view", "squeeze": "view", "unsqueeze": "view", "expand": "view",
    "relu": "activation", "relu_": "activation", "sigmoid": "activation",
    "add": "add", "add_": "add", "mul": "mul", "mul_": "mul", "mean": "mean",
}


@dataclass(frozen=True)
class KindInfo:
    """A node's kind, a label for what it calls, its attributes and whether it aliases its input."""

    kind: str
    target: str
    attrs: dict[str, Any] = field(default_factory=dict)
    aliases_input: bool = False


def classify(node: Node, root: GraphModule) -> KindInfo:
    """Kind, target label and cost-relevant attributes of one fx node."""
    if node.op == "placeholder":
        return KindInfo("input", str(node.target))
    if node.op == "call_module":
        return _classify_module(root.get_submodule(str(node.target)))
    if node.op == "call_method":
        kind = _METHOD_KINDS.get(str(node.target), "other")
        return KindInfo(kind, f"Tensor.{node.target}", _function_attrs(node, root, kind),
                        kind in VIEW_KINDS or str(node.target).endswith("_"))
    kind = _FUNCTION_KINDS.get(node.target, "other")  # type: ignore[arg-type]
    label = _get_qualified_name(node.target) if callable(node.target) else str(node.target)
    aliases = kind in VIEW_KINDS or node.target in (operator.iadd, operator.imul) or bool(node.kwargs.get("inplace"))
    return KindInfo(kind, label, _function_attrs(node, root, kind), aliases)


def _classify_module(module: nn.Module) -> KindInfo:
    kind = next((name for types, name in _MODULE_KINDS if isinstance(module, types)), "other")
    label = f"{type(module).__module__}.{type(module).__qualname__}"
    attrs = _module_attrs(module, kind)
    return KindInfo(kind, label, attrs, kind in VIEW_KINDS or bool(getattr(module, "inplace", False)))


def _module_attrs(module: nn.Module, kind: str) -> dict[str, Any]:
    if kind in ("conv", "conv_transpose"):
        attrs = {name: _jsonable(getattr(module, name)) for name in _CONV_FIELDS}
        attrs["transposed"] = kind == "conv_transpose"
        attrs["bias"] = module.bias is not None
        if kind == "conv_transpose":
            attrs["output_padding"] = _jsonable(module.output_padding)
        return attrs
    if kind in ("maxpool", "avgpool"):
        return {name: _jsonable(getattr(module, name, 1)) for name in _POOL_FIELDS}
    if kind in ("adaptive_avgpool", "adaptive_maxpool"):
        return {"output_size": _jsonable(module.output_size)}
    if kind == "upsample":
        return {name: _jsonable(getattr(module, name)) for name in ("scale_factor", "size", "mode", "align_corners")}
    if kind == "batchnorm":
        return {"eps": module.eps, "affine": module.affine, "track_running_stats": module.track_running_stats}
    if kind == "flatten":
        return {"start_dim": module.start_dim, "end_dim": module.end_dim}
    if kind == "activation":
        return {"function": type(module).__name__}
    return {}


def _function_attrs(node: Node, root: GraphModule, kind: str) -> dict[str, Any]:
    normalized = node.normalized_arguments(root, normalize_to_only_use_kwargs=True) if node.op == "call_function" else None
    kwargs = dict(normalized.kwargs) if normalized is not None else dict(node.kwargs)
    wanted = {
        "cat": ("dim",),
        "flatten": ("start_dim", "end_dim"),
        "maxpool": _POOL_FIELDS,
        "avgpool": ("kernel_size", "stride", "padding", "ceil_mode"),
        "adaptive_avgpool": ("output_size",),
        "adaptive_maxpool": ("output_size",),
        "upsample": ("size", "scale_factor", "mode", "align_corners"),
        "conv": ("stride", "padding", "dilation", "groups"),
    }.get(kind, ())
    attrs = {name: _jsonable(kwargs[name]) for name in wanted if name in kwargs and not isinstance(kwargs[name], Node)}
    if kind == "cat" and "dim" not in attrs:
        attrs["dim"] = int(node.args[1]) if len(node.args) > 1 and isinstance(node.args[1], int) else 0
    if kind == "conv":
        attrs.setdefault("groups", 1)
        attrs["transposed"] = False
    if kind == "activation":
        attrs["function"] = getattr(node.target, "__name__", str(node.target))
    return attrs


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return str(value)
