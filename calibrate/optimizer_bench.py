"""Timing the optimizer's step on the model's own parameter shapes, and fitting seconds per tensor and per byte.

A rank steps its optimizer over the parameters it holds: all of them under a
sample or spatial split, a ``1/c`` slice of each weight under a channel
split, a stage's share in a pipeline. The step is a loop over tensors (a
fixed cost each) streaming their bytes, so ``t = s_per_tensor·tensors +
s_per_byte·bytes`` (:class:`cost_models.profile.OptimizerFit`). It is timed on
the model's parameter shapes split by ``c`` = 1, 2, 4 (the bytes vary) and on
as many one-element tensors (the per-tensor cost), each the median of
``REPEATS`` steps after ``WARMUP`` (which create the optimizer's state),
then fitted with :func:`calibrate.fitting.fit_relative_nnls`.

Assumptions: the optimizers are PyTorch's, as the runtime builds them
(``sgd``: ``SGD(lr)``; ``momentum``: ``SGD(lr, momentum=0.9)``; ``adam``:
``Adam(lr)``), with their default implementation for the device; gradients
are dense and already in place.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from math import prod
from typing import TYPE_CHECKING

import torch

from calibrate.fitting import fit_relative_nnls
from cost_models.ir.kinds import DENSE_KINDS
from cost_models.profile import OptimizerFit

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["OPTIMIZERS", "measure_optimizers", "parameter_shapes"]

OPTIMIZERS: dict[str, Callable[[list[torch.Tensor]], torch.optim.Optimizer]] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-3),
    "momentum": lambda params: torch.optim.SGD(params, lr=1e-3, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
}
SPLITS = (1, 2, 4)
REPEATS = 7
WARMUP = 2


def parameter_shapes(graph: LayerGraph, split: int) -> list[tuple[int, ...]]:
    """One rank's parameter shapes when dense and norm layers split their channels ``split`` ways.

    A layer holds its weight (``weight_shape``) and, when its ``params`` count more, one more tensor of the rest
    (a bias, a norm's shift).
    """
    shapes: list[tuple[int, ...]] = []
    for name in graph.compute_layers():
        layer = graph.nodes[name]
        params = int(layer.params or 0)
        if params == 0:
            continue
        parts = split if layer.kind in DENSE_KINDS | {"batchnorm"} else 1
        weight = tuple(layer.weight_shape or (params,))
        weight = (max(1, -(-weight[0] // parts)), *weight[1:])
        shapes.append(weight)
        rest = params - prod(layer.weight_shape or (params,))
        if rest > 0:
            shapes.append((max(1, -(-rest // parts)),))
    return shapes


def measure_optimizers(graph: LayerGraph, device: str, deadline: float) -> tuple[list[OptimizerFit], list[str]]:
    """Fits for every optimizer timed before ``deadline``; notes for those left out."""
    target = torch.device(device)
    dtype = getattr(torch, graph.graph["dtype"])
    itemsize = torch.empty(0, dtype=dtype).element_size()
    sets = [parameter_shapes(graph, split) for split in SPLITS]
    sets = [shapes for shapes in sets if shapes]
    if not sets:
        return [], []
    sets.append([(1,)] * len(sets[0]))
    fits, notes = [], []
    for name, make in OPTIMIZERS.items():
        if time.monotonic() >= deadline:
            notes.append(f"optimizer {name} not timed: out of budget (its step is priced at zero)")
            continue
        rows, seconds = [], []
        for shapes in sets:
            rows.append([len(shapes), sum(prod(shape) for shape in shapes) * itemsize])
            seconds.append(_time_step(make, shapes, target, dtype))
        coefficients = fit_relative_nnls(rows, seconds)
        fits.append(OptimizerFit(name, float(coefficients[0]), float(coefficients[1]), len(rows)))
    return fits, notes


def _time_step(make: Callable[[list[torch.Tensor]], torch.optim.Optimizer], shapes: Sequence[tuple[int, ...]],
               device: torch.device, dtype: torch.dtype) -> float:
    params = [torch.zeros(shape, device=device, dtype=dtype, requires_grad=True) for shape in shapes]
    for param in params:
        param.grad = torch.randn(param.shape, device=device, dtype=dtype)
    optimizer = make(params)
    runs = []
    for index in range(WARMUP + REPEATS):
        _sync(device)
        started = time.perf_counter()
        optimizer.step()
        _sync(device)
        if index >= WARMUP:
            runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
