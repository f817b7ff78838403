"""The predicted timeline of one training iteration, as Chrome trace events (Perfetto, ``chrome://tracing``).

From an :class:`~cost_models.estimate.Estimate` and its plan: per pipeline stage a trace *process* (the ranks
of a stage are alike under the cost model) with three tracks — ``compute`` (each layer's forward and backward,
named ``parplan.layer:NAME`` as the runtime's profiler ranges are, with what the model prices inside: the
redistribution of its inputs, the exposed halo exchange, the kernels — backward-data, then backward-weight —
batch-norm statistics, a filter split's input-gradient sum), ``gradient allreduce`` (its own stream) and
``link`` (transfers to and from the next stage).

The schedule is the one ``cost_models.pipeline_cost`` prices, laid out event by event:

* one stage, and ``sync`` pipelines: ``M`` micro-batches through the forward flow line (stages and the links
  between them), then the backward one reversed; each stage's allreduces start as backward frees their layer's
  gradient (on the last micro-batch) and the part backward does not hide runs after the whole backward phase
  (the flush), the slowest stage's ending the iteration;
* ``stale`` (DSP): one steady-state period — every stage runs a new batch's forward, recomputes a stashed
  forward and runs its backward; the allreduce part its backward does not hide follows; the stage then waits
  for the rest of the period (the pipeline's pace: its busiest stage, a link, or a staleness window).

Assumptions: a stage's forward and backward seconds (with straggler factors and a refined profile's per-event
overheads) are spread over its layers in proportion to their own; where the estimate hides more allreduce
than the order of the gradients allows (DSP's ``max(0, A − B)``), the allreduces are drawn back to back,
ending where the estimate ends them; ranks sharing cores (``contention``) stretch
every event alike; a refined profile's per-step overhead ends the iteration. So the span of the events is the
estimate's iteration time. Times are microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cost_models.estimate import Estimate, LayerEstimate
from cost_models.formats.plan import Plan

__all__ = ["LAYER_EVENT", "TRACE_FORMAT", "predicted_trace"]

LAYER_EVENT = "parplan.layer:"
"""Prefix of a layer's events here and of its profiler ranges in the runtime (``runtime.layer_times``)."""
TRACE_FORMAT = "parplan.trace/1"
_COMPUTE, _ALLREDUCE, _LINK = 0, 1, 2
_US = 1e6


@dataclass
class _Track:
    """Events of one stage being laid out, in seconds before scaling."""

    stage: int
    events: list[dict[str, Any]]

    def add(self, name: str, start_s: float, seconds: float, tid: int, category: str,
            args: Mapping[str, Any] | None = None) -> float:
        if seconds > 0:
            self.events.append({"name": name, "cat": category, "ph": "X", "ts": start_s, "dur": seconds,
                                "pid": self.stage, "tid": tid, **({"args": dict(args)} if args else {})})
        return start_s + seconds


def predicted_trace(plan: Plan, result: Estimate) -> dict[str, Any]:
    """The Chrome trace document of ``result`` (``plan``'s estimate): ``{"traceEvents": [...], ...}``."""
    tracks = [_Track(stage, []) for stage in range(plan.pipeline.stages)]
    own = [[layer for layer in result.layers if layer.stage == stage] for stage in range(plan.pipeline.stages)]
    if plan.pipeline.schedule == "stale" and plan.pipeline.stages > 1:
        period_s = _stale_period(tracks, own, result)
    else:
        period_s = _sync_iteration(tracks, own, result, plan.pipeline.micro_batches if plan.pipeline.schedule == "sync"
                                   else 1)
    step_s = result.breakdown_s.get("step_overhead", 0.0)
    events = [_scaled(event, result.contention) for track in tracks for event in track.events]
    if step_s:
        events.append({"name": "per-step overhead (refined profile)", "cat": "step", "ph": "X",
                       "ts": period_s * result.contention * _US, "dur": step_s * _US, "pid": 0, "tid": _COMPUTE})
    return {"traceEvents": _metadata(plan) + events, "displayTimeUnit": "ms",
            "otherData": {"format": TRACE_FORMAT, "kind": "predicted", "plan": plan.summary(),
                          "iteration_s": result.iteration_s, "contention": result.contention}}


def _scaled(event: dict[str, Any], contention: float) -> dict[str, Any]:
    return {**event, "ts": event["ts"] * contention * _US, "dur": event["dur"] * contention * _US}


def _sync_iteration(tracks: list[_Track], own: list[list[LayerEstimate]], result: Estimate, micro: int) -> float:
    """Lay out the forward and backward flow lines and the flush; the iteration's seconds (before contention)."""
    stages = result.stages
    forward_ends = _flow_line(tracks, own, [s.forward_s for s in stages], [s.transfer_s for s in stages[:-1]],
                              micro, 0.0, backward=False)
    forward_end = max(forward_ends.values())
    last_backward = _flow_line(tracks, own, [s.backward_s for s in stages], [s.transfer_s for s in stages[:-1]],
                               micro, forward_end, backward=True)
    phase_end = max(last_backward.values(), default=forward_end)
    for track, layers, stage in zip(tracks, own, stages):
        start = last_backward.get(track.stage, phase_end) - stage.backward_s
        _allreduces(track, layers, stage.backward_s, start, phase_end + stage.allreduce_exposed_s)
    return phase_end + max((stage.allreduce_exposed_s for stage in stages), default=0.0)


def _flow_line(tracks: list[_Track], own: list[list[LayerEstimate]], stage_s: Sequence[float],
               transfer_s: Sequence[float], micro: int, start_s: float, backward: bool) -> dict[int, float]:
    """``micro`` jobs through stages and links in turn (reversed for backward); when each stage's last job ends."""
    order = list(range(len(stage_s)))[::-1] if backward else list(range(len(stage_s)))
    ready = [start_s] * micro  # when each micro-batch reaches the next server
    ends: dict[int, float] = {}
    for position, stage in enumerate(order):
        free = start_s
        for m in range(micro):
            begin = max(ready[m], free)
            free = ready[m] = _pass(tracks[stage], own[stage], begin, stage_s[stage], m, backward)
        ends[stage] = free
        if position + 1 < len(order):
            link = min(stage, order[position + 1])
            free = start_s
            for m in range(micro):
                begin = max(ready[m], free)
                name = f"gradients from stage {link + 1}" if backward else f"activations to stage {link + 1}"
                free = ready[m] = tracks[link].add(name, begin, transfer_s[link], _LINK, "transfer",
                                                   {"micro_batch": m})
    return ends


def _pass(track: _Track, layers: Sequence[LayerEstimate], start_s: float, total_s: float, micro: int,
          backward: bool, category: str | None = None) -> float:
    """One forward or backward pass of a stage's layers from ``start_s``, spread over ``total_s``; its end."""
    parts = [_backward_parts(layer) if backward else _forward_parts(layer) for layer in layers]
    own_s = sum(sum(seconds for _, seconds in layer_parts) for layer_parts in parts)
    scale = total_s / own_s if own_s > 0 else 0.0
    clock = start_s
    for layer, layer_parts in zip(reversed(layers) if backward else layers, reversed(parts) if backward else parts):
        seconds = scale * sum(part for _, part in layer_parts)
        args = {"layer": layer.name, "kind": layer.kind, "layout": str(layer.layout), "micro_batch": micro}
        track.add(LAYER_EVENT + layer.name, clock, seconds, _COMPUTE,
                  category or ("backward" if backward else "forward"), args)
        inner = clock
        for name, part in layer_parts:
            inner = track.add(name, inner, scale * part, _COMPUTE, "term")
        clock += seconds
    if own_s <= 0:  # nothing of its own to spread the pass over (a per-event overhead only)
        track.add("stage overhead", start_s, total_s, _COMPUTE, category or ("backward" if backward else "forward"))
    return start_s + total_s


def _forward_parts(layer: LayerEstimate) -> list[tuple[str, float]]:
    cost = layer.cost
    return [("redistribution", layer.redistribution_s / 2), ("halo exchange (exposed)", cost.halo_exposed_s / 2),
            ("forward", cost.forward_s), ("norm statistics", cost.norm_s / 2)]


def _backward_parts(layer: LayerEstimate) -> list[tuple[str, float]]:
    cost = layer.cost
    return [("norm statistics", cost.norm_s / 2), ("backward data", cost.backward_s - cost.backward_weight_s),
            ("backward weight", cost.backward_weight_s), ("input-gradient sum", cost.channel_reduce_s),
            ("halo exchange (exposed)", cost.halo_exposed_s / 2), ("redistribution", layer.redistribution_s / 2)]


def _allreduces(track: _Track, layers: Sequence[LayerEstimate], backward_s: float, start_s: float,
                end_s: float) -> None:
    """Each layer's allreduce as backward (from ``start_s``) frees its gradient, all ending by ``end_s``."""
    own_s = sum(sum(seconds for _, seconds in _backward_parts(layer)) for layer in layers)
    scale = backward_s / own_s if own_s > 0 else 0.0
    clock = free = 0.0
    planned: list[tuple[LayerEstimate, float]] = []
    for layer in reversed(layers):
        clock += scale * sum(seconds for _, seconds in _backward_parts(layer))
        if layer.cost.allreduce_s:
            planned.append((layer, max(free, clock)))
            free = max(free, clock) + layer.cost.allreduce_s
    shift = end_s - (start_s + free)  # > 0: the estimate exposes more (after the phase); < 0: it hides more
    if shift < 0:  # DSP's max(0, A − B) assumes every allreduce hides: drawn back to back, ending at end_s
        planned = [(layer, end_s - start_s - sum(other.cost.allreduce_s for other, _ in planned[index:]))
                   for index, (layer, _) in enumerate(planned)]
        shift = 0.0
    for layer, begin in planned:
        track.add(f"allreduce {layer.name}", start_s + begin + shift, layer.cost.allreduce_s, _ALLREDUCE, "allreduce",
                  {"layer": layer.name})


def _stale_period(tracks: list[_Track], own: list[list[LayerEstimate]], result: Estimate) -> float:
    """One steady-state period of DSP per stage; its seconds (before contention)."""
    period = (result.iteration_s - result.breakdown_s.get("step_overhead", 0.0)) / result.contention
    for track, layers, stage in zip(tracks, own, result.stages):
        clock = _pass(track, layers, 0.0, stage.forward_s, 0, backward=False)
        clock = _pass(track, layers, clock, stage.forward_s, 0, backward=False, category="recompute")
        end = _pass(track, layers, clock, stage.backward_s, 0, backward=True)
        busy = end + max(0.0, stage.allreduce_s - stage.backward_s)
        _allreduces(track, layers, stage.backward_s, clock, busy)
        if track.stage + 1 < len(tracks):
            track.add(f"activations to stage {track.stage + 1}", 0.0, stage.transfer_s, _LINK, "transfer")
        track.add("waiting for the pipeline", busy, period - busy, _COMPUTE, "bubble")
    return period


def _metadata(plan: Plan) -> list[dict[str, Any]]:
    events = []
    first = 0
    for stage, devices in enumerate(plan.pipeline.devices_per_stage):
        name = f"stage {stage}: ranks {first}–{first + devices - 1}" if devices > 1 else f"stage {stage}: rank {first}"
        events.append({"name": "process_name", "ph": "M", "pid": stage, "args": {"name": name}})
        for tid, track in ((_COMPUTE, "compute"), (_ALLREDUCE, "gradient allreduce"), (_LINK, "link")):
            events.append({"name": "thread_name", "ph": "M", "pid": stage, "tid": tid, "args": {"name": track}})
        first += devices
    return events
