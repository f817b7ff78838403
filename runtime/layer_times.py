"""Per-layer forward and backward seconds of a training step, from the PyTorch profiler.

With :attr:`DistributedModel.layer_ranges` set, each layer of the plan runs
inside a profiler range ``parplan.layer:NAME``. Its forward seconds are that
range's CPU time: the layer's kernels and the redistribution of its inputs
(halo exchanges, batch-norm statistics, layout changes happen inside). Its
backward seconds are the autograd engine's evaluation of every node whose
forward op ran inside the range, matched by the autograd sequence number
the profiler records on both (``FunctionEvent.sequence_nr``) — exact under
residual branches, where intervals between hooks would mix layers.

Assumptions: one forward thread (sequence numbers are per thread); the weight
update, the loss and the gradient accumulation (``AccumulateGrad``) belong to
no layer; collective waits inside a layer count for that layer, so each layer's
figure is taken as the slowest rank's.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol, TypedDict

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from cost_models.formats.jsonio import read_json, write_json_atomic
from cost_models.formats.timeline import LAYER_EVENT, TRACE_FORMAT
from runtime.waiting import all_reduce

if TYPE_CHECKING:
    from torch.autograd.profiler_util import FunctionEvent

    from cost_models.formats.plan import Plan

__all__ = ["LAYER_RANGE", "LayerTimes", "Profiled", "layer_seconds", "profiled_layer_times", "profiled_trace"]

LAYER_RANGE = LAYER_EVENT  # the predicted timeline's layer events are named alike (``cost_models.formats.timeline``)
_BACKWARD = "autograd::engine::evaluate_function: "


class Profiled(Protocol):
    """What is profiled layer by layer: a ``DistributedModel`` or a pipeline stage (``runtime.pipeline.stage``)."""

    layer_ranges: bool
    """Whether each layer runs in a profiler range ``parplan.layer:NAME``."""

    @property
    def plan(self) -> Plan: ...


class LayerTimes(TypedDict):
    """One layer's median seconds per step, the slowest rank's (the measurement's ``layers``)."""

    name: str
    forward_s: float
    backward_s: float


def layer_seconds(events: Iterable[FunctionEvent]) -> dict[str, tuple[float, float]]:
    """``{layer: (forward_s, backward_s)}`` from a profiler's ``events()`` (see the module docstring)."""
    events = list(events)
    forward: dict[str, float] = {}
    owner: dict[int, str] = {}
    for event in events:
        if event.name.startswith(LAYER_RANGE):
            name = event.name[len(LAYER_RANGE):]
            forward[name] = forward.get(name, 0.0) + event.cpu_time_total * 1e-6
    for event in events:
        layer = _enclosing_layer(event)
        if layer is not None and event.sequence_nr >= 0:
            owner.setdefault(event.sequence_nr, layer)
    backward = dict.fromkeys(forward, 0.0)
    for event in events:
        if event.name.startswith(_BACKWARD) and event.sequence_nr in owner:
            layer = owner[event.sequence_nr]
            backward[layer] += event.cpu_time_total * 1e-6
    return {name: (forward[name], backward[name]) for name in forward}


def _enclosing_layer(event: FunctionEvent) -> str | None:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(LAYER_RANGE):
            return str(parent.name[len(LAYER_RANGE):])
        parent = parent.cpu_parent
    return None


def profiled_layer_times(model: Profiled, step: Callable[[int], None], steps: Iterable[int],
                         device: torch.device) -> list[LayerTimes]:
    """Run ``step`` for each of ``steps`` under the profiler; per layer the median seconds, slowest rank's.

    Collective: every rank of the default group must call it with the same steps.
    """
    per_layer: dict[str, list[tuple[float, float]]] = {}
    model.layer_ranges = True
    try:
        for index in steps:
            with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as recorded:
                step(index)
            for name, seconds in layer_seconds(recorded.events()).items():
                per_layer.setdefault(name, []).append(seconds)
    finally:
        model.layer_ranges = False
    names = list(model.plan.layers)  # a pipeline stage times its own; the largest over ranks is the owner's
    medians = torch.tensor([[statistics.median(s[0] for s in per_layer[name]),
                             statistics.median(s[1] for s in per_layer[name])] if name in per_layer else [0.0, 0.0]
                            for name in names], dtype=torch.float64, device=device).reshape(len(names), 2)
    all_reduce(medians, "the per-layer times allreduce", dist.ReduceOp.MAX)
    return [{"name": name, "forward_s": float(medians[i, 0]), "backward_s": float(medians[i, 1])}
            for i, name in enumerate(names) if medians[i].sum() > 0]


def profiled_trace(model: Profiled, step: Callable[[int], None], index: int, device: torch.device,
                   path: str) -> None:
    """Run ``step(index)`` under the profiler, each layer in its range; rank 0 writes its Chrome trace to ``path``.

    Collective: every rank of the default group must call it. Written atomically, with ``otherData`` saying what
    it is (``parplan.trace/1``, measured, this rank).
    """
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    model.layer_ranges = True
    try:
        with _quiet_stderr(), profile(activities=activities) as recorded:
            step(index)
    finally:
        model.layer_ranges = False
    if dist.get_rank() != 0:
        return
    scratch = f"{path}.{os.getpid()}.profiler"
    try:
        recorded.export_chrome_trace(scratch)
        document = read_json(scratch, "the profiler's trace")
    finally:
        if os.path.exists(scratch):
            os.remove(scratch)
    extra = {"format": TRACE_FORMAT, "kind": "measured", "rank": 0, "step": index}
    write_json_atomic(path, {**document, "otherData": {**document.get("otherData", {}), **extra}})


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 meanwhile: the profiler's C++ side logs start/stop lines there on every use."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
