"""Timing the real kernels of one local problem's pass.

Each (problem, pass) becomes a zero-argument callable on real tensors of the
local shapes, which ``torch.utils.benchmark`` times (CPU) or CUDA events time
(GPU, via the same Timer, which synchronises). Convolutions run their three
kernels separately — forward, backward-data and backward-weight, through
``aten.convolution_backward`` with one output mask each — as the seed work
timed them; linear layers their three matrix products; attention its call
(``calibrate.attention_kernel``); every other kind its forward function and
the autograd backward of that one function.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils import benchmark

from calibrate.attention_kernel import attention_kernel
from cost_models.local_problem import LocalProblem

__all__ = ["TIMED_KINDS", "KernelTiming", "build_kernel", "time_kernel"]

TIMED_KINDS = frozenset({"conv", "conv_transpose", "linear", "batchnorm", "maxpool", "avgpool", "adaptive_avgpool",
                         "adaptive_maxpool", "upsample", "cat", "add", "mul", "elementwise", "dropout", "activation",
                         "norm", "pad", "pixel_shuffle", "attention"})
"""Kinds with a kernel here; others are predicted by the pooled fit of their pass."""

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "ReLU": F.relu, "relu": F.relu, "ReLU6": F.relu6, "relu6": F.relu6, "SiLU": F.silu, "silu": F.silu,
    "GELU": F.gelu, "gelu": F.gelu, "Hardswish": F.hardswish, "hardswish": F.hardswish,
    "Sigmoid": torch.sigmoid, "sigmoid": torch.sigmoid, "Tanh": torch.tanh, "tanh": torch.tanh,
}


@dataclass(frozen=True)
class KernelTiming:
    """Median and interquartile range of repeated runs, and how many runs."""

    median_s: float
    iqr_s: float
    repeats: int


def time_kernel(fn: Callable[[], object], min_run_time_s: float, threads: int, blocks: int = 5) -> KernelTiming:
    """Time ``fn`` in ``blocks`` blocks of equal run counts; median and IQR of the per-run block means.

    One warm-up call also sizes the blocks so that all of them together last
    about ``min_run_time_s`` (at least one run per block; a single block when
    one run already takes longer).
    """
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    first_s = max(timer.timeit(number=1).median, 1e-7)
    blocks = max(1, min(blocks, int(min_run_time_s / first_s)))  # a kernel longer than the budget runs once
    number = max(1, int(min_run_time_s / blocks / first_s))
    per_run = sorted(timer.timeit(number=number).median for _ in range(blocks))
    quartiles = statistics.quantiles(per_run, n=4, method="inclusive") if len(per_run) > 1 else [per_run[0]] * 3
    return KernelTiming(statistics.median(per_run), quartiles[2] - quartiles[0], blocks * number)


def build_kernel(problem: LocalProblem, phase: str, device: torch.device) -> Callable[[], object]:
    """A callable running ``phase`` of ``problem`` on random tensors of its local shapes."""
    dtype = getattr(torch, problem.dtype)
    attrs = dict(problem.attrs)
    inputs = [torch.randn(shape, dtype=dtype, device=device) for shape in problem.input_shapes]
    weight = torch.randn(problem.weight_shape, dtype=dtype, device=device) if problem.weight_shape else None
    if problem.kind in ("conv", "conv_transpose"):
        return _conv_kernel(problem, phase, inputs[0], weight, attrs)
    if problem.kind == "linear":
        assert weight is not None, f"a linear layer has a weight: {problem.key}"
        return _linear_kernel(phase, inputs[0], weight)
    if problem.kind == "attention":
        return attention_kernel(problem, phase, inputs)
    forward = _forward_function(problem.kind, attrs, weight, problem.output_shape, inputs[0])
    if phase == "fwd":
        return lambda: forward(*inputs)
    leaves = [x.requires_grad_() for x in inputs]
    output = forward(*leaves)
    grad_output = torch.randn_like(output)
    return lambda: torch.autograd.grad(output, leaves, grad_output, retain_graph=True)


def _conv_kernel(problem: LocalProblem, phase: str, x: torch.Tensor, weight: torch.Tensor | None,
                 attrs: dict[str, Any]) -> Callable[[], object]:
    spatial = len(problem.output_shape) - 2
    stride, padding, dilation = (_tuple(attrs.get(name, default), spatial)
                                 for name, default in (("stride", 1), ("padding", 0), ("dilation", 1)))
    transposed = problem.kind == "conv_transpose"
    output_padding = _tuple(attrs.get("output_padding", 0), spatial)
    groups = int(attrs.get("groups", 1))
    args = (stride, padding, dilation, transposed, output_padding, groups)
    if phase == "fwd":
        return lambda: torch.ops.aten.convolution(x, weight, None, *args)
    grad_output = torch.randn(problem.output_shape, dtype=x.dtype, device=x.device)
    mask = [phase == "bwd_data", phase == "bwd_weight", False]
    return lambda: torch.ops.aten.convolution_backward(grad_output, x, weight, None, *args, mask)


def _linear_kernel(phase: str, x: torch.Tensor, weight: torch.Tensor) -> Callable[[], object]:
    rows = x.reshape(-1, x.shape[-1])
    grad_output = torch.randn(rows.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    if phase == "fwd":
        return lambda: torch.mm(rows, weight.t())
    if phase == "bwd_data":
        return lambda: torch.mm(grad_output, weight)
    return lambda: torch.mm(grad_output.t(), rows)


def _forward_function(kind: str, attrs: dict[str, Any], weight: torch.Tensor | None, output_shape: tuple[int, ...],
                      like: torch.Tensor) -> Callable[..., torch.Tensor]:
    """The forward of ``kind`` on inputs of ``like``'s device and dtype (its own parameters made there too)."""
    if kind == "batchnorm":
        channels = weight.shape[0] if weight is not None else output_shape[1]
        gamma = torch.ones(channels, dtype=like.dtype, device=like.device, requires_grad=True)
        beta = torch.zeros(channels, dtype=like.dtype, device=like.device, requires_grad=True)
        return lambda x: F.batch_norm(x, None, None, gamma, beta, training=True, eps=attrs.get("eps", 1e-5))
    axes = min(max(len(output_shape) - 2, 1), 3)  # 1-D sequences, 2-D images, 3-D volumes
    if kind in ("maxpool", "avgpool"):
        pool = getattr(F, f"{'max' if kind == 'maxpool' else 'avg'}_pool{axes}d")
        extra = {"dilation": attrs.get("dilation", 1)} if kind == "maxpool" else {}
        return lambda x: pool(x, attrs["kernel_size"], attrs.get("stride") or attrs["kernel_size"],
                              attrs.get("padding", 0), ceil_mode=bool(attrs.get("ceil_mode", False)), **extra)
    if kind in ("adaptive_avgpool", "adaptive_maxpool"):
        size = tuple(output_shape[2:])
        adaptive = getattr(F, f"adaptive_{'avg' if kind == 'adaptive_avgpool' else 'max'}_pool{axes}d")
        return lambda x: adaptive(x, size)
    if kind == "upsample":
        mode = attrs.get("mode") or "nearest"
        corners = attrs.get("align_corners") if mode in ("bilinear", "bicubic") else None
        return lambda x: F.interpolate(x, size=tuple(output_shape[2:]), mode=mode, align_corners=corners)
    if kind == "cat":
        return lambda *xs: torch.cat(xs, dim=int(attrs.get("dim", 1)))
    if kind in ("add", "mul", "elementwise"):
        return ((lambda a, b=None: a * (b if b is not None else a)) if kind == "mul"
                else (lambda a, b=None: a + (b if b is not None else a)))
    if kind == "dropout":
        rate = float(attrs.get("p", 0.5)) if isinstance(attrs.get("p", 0.5), (int, float)) else 0.5
        return lambda x: F.dropout(x, rate, training=True)
    if kind == "norm":
        return _norm_function(attrs, weight, output_shape)
    if kind == "pad" and isinstance(attrs.get("pad"), (list, tuple)):
        mode = str(attrs.get("mode") or "constant")
        return lambda x: F.pad(x, list(attrs["pad"]), mode=mode) if mode != "constant" else F.pad(x, list(attrs["pad"]))
    if kind == "pixel_shuffle" and isinstance(attrs.get("factor"), int):
        shuffle = F.pixel_unshuffle if attrs.get("inverse") else F.pixel_shuffle
        return lambda x: shuffle(x, attrs["factor"])
    if kind == "activation" and str(attrs.get("function")) in _ACTIVATIONS:
        return _ACTIVATIONS[str(attrs.get("function"))]
    raise ValueError(f"no kernel to time for layer kind {kind!r} ({dict(attrs)}); it is left to the pooled fit")


def _norm_function(attrs: dict[str, Any], weight: torch.Tensor | None,
                   output_shape: tuple[int, ...]) -> Callable[..., torch.Tensor]:
    """A LayerNorm over its last dimensions, a GroupNorm or an InstanceNorm, on the box."""
    norm = str(attrs.get("norm", ""))
    if norm == "LayerNorm":
        normalized = tuple(attrs.get("normalized_shape") or output_shape[-1:])
        return lambda x: F.layer_norm(x, normalized, eps=float(attrs.get("eps", 1e-5)))
    if norm.startswith("InstanceNorm") and len(output_shape) >= 3:  # its own kernel: a batch-norm of N·C channels
        return lambda x: F.instance_norm(x, eps=float(attrs.get("eps", 1e-5)))
    if norm == "GroupNorm" and len(output_shape) >= 3:
        groups = int(attrs.get("num_groups") or output_shape[1]) if norm == "GroupNorm" else output_shape[1]
        return lambda x: F.group_norm(x, groups, eps=float(attrs.get("eps", 1e-5)))
    raise ValueError(f"no kernel to time for the norm {attrs!r}; it is left to the pooled fit")


def _tuple(value: int | list[int] | tuple[int, ...], count: int) -> list[int]:
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)] * count
