"""What every rank of ``parplan run`` does for a plan with pipeline stages: build its stage, verify, train, measure.

A *step* is one iteration of the plan's schedule:

* ``sync``: the ``M`` micro-batches of one global batch in GPipe (fill/drain)
  or 1F1B order (``order``), then one update on every stage. A step's time is
  the slowest rank's wall time (an allreduce of the per-rank times after it,
  as for single-stage plans).
* ``stale``: one batch; the ranks run DSP over all ``steps`` batches without
  any barrier. A step's time is the interval between two consecutive updates
  of the last stage (the pipeline's throughput, fill included in the first);
  ``wall_s`` is the whole run's.

With ``--checkpoint-every N`` a sync pipeline runs in segments of ``N`` steps
and writes a checkpoint after each (``runtime.recovery``; every step flushes,
so the cut changes nothing). A stale pipeline does not drain for them: each
stage writes its part right after its own ``N``-th update, its batches in
flight included (``_Checkpoints``), so checkpointing leaves its trajectory
unchanged and a run resumed from one — killed or not — continues it bit for
bit. It drains only where warm-up ends (the timed steps start with a fill).

Per stage the document reports busy time (events' wall time minus the time
they waited on receives; a ``--slow-stage`` sleep counts as busy), waiting
time, the staleness it achieved (updates between a batch's forward and its
backward, the largest over the batches) and the staleness planned.

With ``RunOptions.per_layer`` each layer's forward and backward seconds per
batch follow (``runtime.layer_times``; a stale stage's forward counts its
recomputation too).

``verify`` runs one iteration without its update (for ``stale``: one batch
with staleness 0, which is what the stage cut must get right; staleness is
the schedule's intended difference) next to the unsplit model accumulating
the same micro-batches with the same keyed random draws, and reports the
errors of the last stage's outputs and of every parameter gradient, over all
ranks, as ``runtime.train``'s verify does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

import torch
import torch.distributed as dist

from cost_models.errors import PlanError
from cost_models.formats.plan import Plan
from runtime.batches import factory_batches, synthetic_inputs, synthetic_target
from runtime.checkpoint import Progress
from runtime.fault_injection import planned, strike
from runtime.layer_times import LayerTimes, profiled_layer_times, profiled_trace
from runtime.losses import resolve_loss, target_shape
from runtime.measurement import largest_over_ranks, measurement_document, peak_memory_bytes, synchronise, verify_only
from runtime.memory_peak import held_tensors, peak_tensor_bytes
from runtime.options import PER_LAYER_STEPS, RunOptions
from runtime.pipeline.schedules import Event, dsp, dsp_after, forwarded_after, gpipe, one_f_one_b, staleness_of
from runtime.pipeline.stage import EventRecord, PipelineStage, apply_pipeline
from runtime.pipeline.stash import InFlight
from runtime.random_ops import DrawKey, inside_switched_off
from runtime.recovery import Recovery, training_state
from runtime.seeded_model import fresh_model, reference_identity, sgd
from runtime.shared_reference import shared_reference, shared_rounding
from runtime.verify import (
    Comparison,
    compare_gradients,
    compare_outputs,
    compared_parameters,
    keep_references_of,
    random_report,
    reference_step,
)
from runtime.waiting import all_reduce, at, barrier

__all__ = ["pipeline_worker"]

Loader = Callable[[int], tuple[tuple[torch.Tensor, ...] | None, torch.Tensor | None]]


def pipeline_worker(options: RunOptions, plan: Plan, device: torch.device) -> dict[str, object] | None:
    """Run on every rank; returns the measurement's fields (``runtime.train``) on rank 0."""

    if options.amp:

        raise PlanError(f"--amp {options.amp} runs single-stage plans only; this plan has {plan.pipeline.stages} "
                        f"stages")
    plan = _capped(plan, options.staleness)
    dtype = getattr(torch, options.dtype)
    verified = _verified(options, plan, dtype, device) if options.verify else None
    if options.verify and options.warmup + options.steps == 0:
        return verify_only(options, plan, verified, device)
    stage = _build(options, plan, dtype, device)
    optimizer = sgd(stage.parameters(), lr=options.lr)
    recovery = Recovery(options, training_state(stage.model, optimizer, stage.buffers), device)
    progress, records, wall_s = _train_segments(options, plan, stage, optimizer, dtype, device, recovery)
    stages = _stage_report(stage, plan, records, wall_s, device, dict(options.slow_stages))
    peak = _peak_tensors(options, plan, stage, optimizer, dtype, device) if options.steps else None
    layers = _layer_times(options, plan, stage, optimizer, dtype, device) if options.per_layer else None
    if options.trace:
        _trace(options, plan, stage, optimizer, dtype, device)
    memory = peak_memory_bytes(device)
    if dist.get_rank() != 0:
        return None
    document = measurement_document(options, plan, progress.per_step_s, progress.losses, memory, verified, peak)
    document["recovery"] = recovery.report()
    document["pipeline"] = {"schedule": plan.pipeline.schedule, "stages": plan.pipeline.stages,
                            "micro_batches": plan.pipeline.micro_batches, "order": _order(options, plan),
                            "wall_s": wall_s, "per_stage": stages}
    if layers is not None:
        document["layers"] = layers
    return document


def _peak_tensors(options: RunOptions, plan: Plan, stage: PipelineStage, optimizer: torch.optim.Optimizer,
                  dtype: torch.dtype, device: torch.device) -> int:
    """One more batch (a sync iteration; a stale batch with its fill and drain), measuring its peak bytes of live
    tensors (``runtime.memory_peak``); the largest rank's."""

    step = options.warmup + options.steps
    optimizer.zero_grad(set_to_none=True)
    held = held_tensors(stage.model, optimizer, *stage.model.gradients.buffers())
    return largest_over_ranks(peak_tensor_bytes(
        lambda: _train(options, plan, stage, optimizer, range(step, step + 1), dtype, device), device, held), device)


def _layer_times(options: RunOptions, plan: Plan, stage: PipelineStage, optimizer: torch.optim.Optimizer,
                 dtype: torch.dtype, device: torch.device) -> list[LayerTimes]:
    """Per layer seconds of one more batch at a time (a sync iteration; a stale batch with its fill and drain)."""

    def one_batch(step: int) -> None:
        _train(options, plan, stage, optimizer, range(step, step + 1), dtype, device)

    first = options.warmup + options.steps + 1  # after the memory step
    return profiled_layer_times(stage, one_batch, range(first, first + PER_LAYER_STEPS), device)


def _trace(options: RunOptions, plan: Plan, stage: PipelineStage, optimizer: torch.optim.Optimizer,
           dtype: torch.dtype, device: torch.device) -> None:
    """One more batch under the profiler; rank 0 (stage 0) writes its trace to ``options.trace``."""

    def one_batch(step: int) -> None:
        _train(options, plan, stage, optimizer, range(step, step + 1), dtype, device)

    after = options.warmup + options.steps + 1 + (PER_LAYER_STEPS if options.per_layer else 0)
    profiled_trace(stage, one_batch, after, device, options.trace)


def _train_segments(options: RunOptions, plan: Plan, stage: PipelineStage, optimizer: torch.optim.Optimizer,
                    dtype: torch.dtype, device: torch.device,
                    recovery: Recovery) -> tuple[Progress, list[list[EventRecord]], float]:
    """The steps not done yet, segment by segment (``_segments``), a checkpoint after each when due — or, in a
    stale pipeline, at each due update inside its segment (``_Checkpoints``).

    Returns the progress, the event records of each timed segment (batch numbers restart in each) and their
    wall seconds.
    """
    progress = recovery.start()
    records: list[list[EventRecord]] = []
    wall_s = 0.0
    stale = plan.pipeline.schedule == "stale"
    every = 0 if stale else options.checkpoint_every
    for steps in _segments(0 if stale else progress.step, options.warmup, options.warmup + options.steps, every):
        if steps.stop <= progress.step:
            continue
        done, in_flight = progress.step - steps.start if steps.start < progress.step else 0, recovery.in_flight
        if done and in_flight is None:  # nothing to continue (another plan's checkpoint, or a /3 one): refill
            steps, done = range(progress.step, steps.stop), 0
        timed = steps.start >= options.warmup
        checkpoints = _Checkpoints(recovery, progress, steps, timed, stage, device) if stale else None
        per_step, segment_records, segment_s = _train(options, plan, stage, optimizer, steps, dtype, device,
                                                      done=done, in_flight=in_flight if done else None,
                                                      checkpoints=checkpoints)
        recovery.in_flight = None
        losses = _losses(stage, range(steps.start + done, steps.stop), plan.pipeline.micro_batches, device)
        progress.step = steps.stop
        if timed:
            progress.per_step_s += per_step
            progress.losses += losses
            records.append(segment_records)
            wall_s += segment_s
        if not stale:
            recovery.after_step(progress)
    return progress, records, wall_s


def _segments(first: int, warmup: int, total: int, every: int) -> list[range]:
    """The steps ``first … total−1`` cut where warm-up ends and after every ``every``-th step (a checkpoint).

    A stale pipeline drains at each cut: the batches after it are forwarded with every earlier update done — so
    its checkpoints are written inside a segment instead (``_Checkpoints``), and it is cut at warm-up's end only.
    """
    if first >= total:
        return []
    cuts = sorted({first, total, *([warmup] if first < warmup < total else []),
                   *(range(every * (first // every + 1), total, every) if every else ())})
    return [range(a, b) for a, b in zip(cuts, cuts[1:])]


class _Checkpoints:
    """A stale pipeline's checkpoints inside a segment, written at a consistent cut without a drain.

    Each stage writes the checkpoint after ``t`` updates right after its own ``t``-th update. By then stage
    ``k`` (staleness ``s_k``, non-increasing along the pipeline) has forwarded batches up to ``t + s_k − 1`` and
    backwarded those before ``t``: it saves, besides its weights and optimizer, the inputs, draws' keys and RNG
    states of batches ``t … t + s_k − 1`` (in flight), and first receives what its producers already sent for
    batches it has not forwarded yet (``t + s_k`` up to the producer's ``t + s_p − 1``), saving those too. No
    message sent after a stage's cut is received before another's, and every gradient of a batch before ``t``
    has arrived, so the saved states are one state of the whole pipeline: a run resumed from them, continuing
    the schedule's events after the ``t``-th update (``runtime.pipeline.schedules.dsp_after``), trains as the
    uninterrupted run does, bit for bit.
    """

    def __init__(self, recovery: Recovery, progress: Progress, steps: range, timed: bool, stage: PipelineStage,
                 device: torch.device) -> None:
        self.recovery, self.progress, self.steps, self.timed = recovery, progress, steps, timed
        self.stage, self.device = stage, device
        self.started = time.perf_counter()
        self.losses_before = len(stage.losses)  # where this run's losses begin in the last stage's list
        self.first = progress.step  # the step this run began at

    def __call__(self, batch: int, records: list[EventRecord]) -> None:
        step = self.steps[batch] + 1  # updates done
        if not self.recovery.due(step):
            return
        updates, staleness = batch + 1, self.stage.plan.pipeline.staleness

        def reach(k: int) -> int:
            return forwarded_after(len(self.steps), staleness[k], updates)

        self.stage.receive_ahead({c.name: range(reach(self.stage.index), reach(c.producer))
                                  for c in self.stage.cut.receives})
        losses = _losses_of(self.stage, self.losses_before, step - self.first, 1, self.device)
        intervals = _update_intervals(self.stage, records, self.started, self.device)
        now = Progress(step, self.progress.losses + (losses if self.timed else []),
                       self.progress.per_step_s + (intervals if self.timed else []))
        self.recovery.after_step(now, _numbered(self.stage.in_flight(), self.steps.start))


def _numbered(in_flight: InFlight, start: int) -> InFlight:
    """Batches in flight numbered by their step (their batch number in the segment ``+ start``)."""
    return {"stash": {start + b: entry for b, entry in in_flight["stash"].items()}, "losses": in_flight["losses"],
            "ahead": {start + b: named for b, named in in_flight["ahead"].items()}}


def _capped(plan: Plan, bound: int | None) -> Plan:
    """The plan with every stage's staleness at most ``bound`` (``--staleness``)."""
    if bound is None or plan.pipeline.schedule != "stale":
        return plan
    staleness = tuple(min(s, bound) for s in plan.pipeline.staleness)
    return replace(plan, pipeline=replace(plan.pipeline, staleness=staleness))


def _build(options: RunOptions, plan: Plan, dtype: torch.dtype, device: torch.device,
           sync_batchnorm: bool | None = None) -> PipelineStage:

    model = fresh_model(options, dtype, device)
    slowdown = float(dict(options.slow_stages).get(plan.pipeline.stage_of(dist.get_rank()), 1.0))
    stage = apply_pipeline(model, plan, options.sync_batchnorm if sync_batchnorm is None else sync_batchnorm,
                           options.leaf_modules, graph=options.graph, slowdown=slowdown, timeout=options.timeout,
                           random_seed=options.seed, loss_fn=resolve_loss(options.loss))
    stage.output_key = options.output  # the part of the output the last stage takes the loss of
    return stage


def _order(options: RunOptions, plan: Plan) -> str:
    return "dsp" if plan.pipeline.schedule == "stale" else options.order


def _events(options: RunOptions, plan: Plan, stage: PipelineStage, batches: int = 1) -> tuple[Event, ...]:
    micro = plan.pipeline.micro_batches
    if plan.pipeline.schedule == "stale":
        return dsp(batches, plan.pipeline.staleness[stage.index])
    return gpipe(micro) if _order(options, plan) == "gpipe" else one_f_one_b(plan.pipeline.stages, stage.index, micro)


def _train(options: RunOptions, plan: Plan, stage: PipelineStage, optimizer: torch.optim.Optimizer, steps: range,
           dtype: torch.dtype, device: torch.device, *, done: int = 0, in_flight: InFlight | None = None,
           checkpoints: Callable[[int, list[EventRecord]], None] | None = None
           ) -> tuple[list[float], list[EventRecord], float]:
    """Run ``steps``; returns per-step seconds, this rank's event records and the wall time (slowest rank).

    A stale pipeline resumed ``done`` updates into ``steps`` takes back its batches ``in_flight`` and runs the
    rest of its schedule; ``checkpoints`` is called after each of its updates.
    """

    barrier("the barrier before the pipeline's first step")
    fault, rank = planned(), dist.get_rank()
    started = time.perf_counter()
    if plan.pipeline.schedule == "stale":
        def batch_data(batch: int) -> tuple[tuple[torch.Tensor, ...] | None, torch.Tensor | None]:
            strike(fault, rank, steps[batch] + 1)
            return _load(options, stage, steps[batch], 0, dtype, device)

        if in_flight is not None:
            stage.reinstall(in_flight, shift=steps.start)
        events = dsp_after(len(steps), plan.pipeline.staleness[stage.index], done)
        with at(f"steps {steps.start + done + 1}…{steps.stop}"):
            records = stage.run(events, optimizer, batch_data, keys=lambda batch: DrawKey(options.seed, steps[batch]),
                                after_update=checkpoints)
        per_step = _update_intervals(stage, records, started, device)
    else:
        records, per_step = [], []
        for step in steps:
            strike(fault, rank, step + 1)
            begun = time.perf_counter()
            with at(f"step {step + 1}"):
                records += stage.run(_events(options, plan, stage), optimizer,
                                     partial(_load, options, stage, step, dtype=dtype, device=device),
                                     last_backward=plan.pipeline.micro_batches - 1, keys=_keys(options, stage, step))
            synchronise(device)
            per_step.append(_slowest(time.perf_counter() - begun, device))
    return per_step, records, _slowest(time.perf_counter() - started, device)


def _load(options: RunOptions, stage: PipelineStage, step: int, micro: int, dtype: torch.dtype, device: torch.device
          ) -> tuple[tuple[torch.Tensor, ...] | None, torch.Tensor | None]:
    """This rank's input boxes (first stage: one per model input) and target box (last stage) of micro-batch
    ``micro`` of ``step``."""
    if not (stage.first or stage.last):
        return None, None
    part = stage.model_for(micro)
    output_shape = part.layer_graph.nodes[part.output_name].output_shape
    size, first = stage.samples(micro), stage.first_sample(micro)
    x_boxes = tuple(_shifted(box, first) for box in stage.input_boxes(micro)) if stage.first else None
    shape = target_shape(options.target, (size, *output_shape[1:]))
    t_box = _shifted(stage.target_box(shape, micro), first) if stage.last else None
    inputs, target = _batch(options, output_shape, x_boxes or _empty_boxes(options),
                            t_box or _empty(len(shape)), step, dtype, device)
    return (inputs if x_boxes else None), (target if t_box else None)


def _batch(options: RunOptions, output_shape: Sequence[int], x_boxes: tuple[tuple[slice, ...], ...],
           t_box: tuple[slice, ...], step: int, dtype: torch.dtype,
           device: torch.device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """The inputs' and the target's boxes of ``step`` (boxes of the global batch): the ``--data`` factory's, or
    synthetic."""

    if options.data:
        return factory_batches(options.data, x_boxes, t_box, dtype, device)(step)
    seed = options.seed * 1000 + step
    label_shape = target_shape(options.target, (options.input_shape[0], *output_shape[1:]))
    return (synthetic_inputs(options.shapes, x_boxes, seed, dtype, device),
            synthetic_target(label_shape, t_box, output_shape[1], seed, dtype, device,
                             regression=options.target == "output"))


def _keys(options: RunOptions, stage: PipelineStage, step: int) -> Callable[[int], DrawKey]:
    """The keys of a sync step's micro-batches: the step, and the global index of each one's first sample."""
    return lambda micro: DrawKey(options.seed, step, stage.first_sample(micro))


def _shifted(box: tuple[slice, ...], offset: int) -> tuple[slice, ...]:
    return (slice(box[0].start + offset, box[0].stop + offset), *box[1:])


def _empty(dims: int) -> tuple[slice, ...]:
    return tuple(slice(0, 1) for _ in range(dims))


def _empty_boxes(options: RunOptions) -> tuple[tuple[slice, ...], ...]:
    """A one-element box of each input (what a last stage that loads no input asks the factory for)."""
    return tuple(_empty(len(shape)) for shape in options.shapes)


def _update_intervals(stage: PipelineStage, records: list[EventRecord], started: float,
                      device: torch.device) -> list[float]:
    """Seconds between consecutive updates of the last stage's first rank, sent to every rank."""
    times = [record.end_s for record in records if record.event.kind == "U"]
    intervals = [b - a for a, b in zip([started, *times], times)]
    values = torch.tensor(intervals if stage.last and stage.member == 0 else [0.0] * len(intervals),
                          dtype=torch.float64, device=device)
    all_reduce(values, "the update-interval allreduce")
    return [float(v) for v in values]


def _slowest(seconds: float, device: torch.device) -> float:
    value = torch.tensor([seconds], dtype=torch.float64, device=device)
    all_reduce(value, "the step-time allreduce", dist.ReduceOp.MAX)
    return float(value.item())


def _losses(stage: PipelineStage, steps: range, micro: int, device: torch.device) -> list[float]:
    """The unsplit loss of each step: the last stage's shares summed over its ranks and micro-batches."""
    return _losses_of(stage, len(stage.losses) - len(steps) * micro, len(steps), micro, device)


def _losses_of(stage: PipelineStage, start: int, steps: int, micro: int, device: torch.device) -> list[float]:
    """The unsplit loss of ``steps`` steps whose shares begin at ``start`` in the last stage's list (collective)."""
    values = torch.zeros(steps, dtype=torch.float64, device=device)
    if stage.last:
        shares = [float(loss) for loss in stage.losses[start:start + steps * micro]]
        for index in range(steps):
            values[index] = _step_loss(stage, shares[index * micro:(index + 1) * micro])
    all_reduce(values, "the loss allreduce")
    return [float(v) for v in values]


def _step_loss(stage: PipelineStage, shares: Sequence[float]) -> float:
    """One step's loss from its micro-batches' mean losses: the mean over equal micro-batches, else each weighted by
    its share of the samples (the unsplit model's mean over the batch)."""
    if len(set(stage.samples(b) for b in range(len(shares)))) == 1:
        return sum(shares) / len(shares)
    return sum(share * stage.loss_scale(b) for b, share in enumerate(shares))


def _stage_report(stage: PipelineStage, plan: Plan, segments: list[list[EventRecord]], wall_s: float,
                  device: torch.device, slowdowns: dict[int, float]) -> list[dict[str, float]]:
    """Per stage: busy and waiting seconds (its slowest rank), busy fraction, staleness achieved and planned."""
    records = [record for segment in segments for record in segment]
    busy = sum(r.end_s - r.start_s - r.wait_s for r in records if r.event.kind != "U") + sum(
        r.end_s - r.start_s for r in records if r.event.kind == "U")
    waited = sum(r.wait_s for r in records)
    achieved = max((max(staleness_of([r.event for r in segment]).values(), default=0) for segment in segments),
                   default=0)
    table = torch.zeros(plan.pipeline.stages, 3, dtype=torch.float64, device=device)
    table[stage.index] = torch.tensor([busy, waited, achieved], dtype=torch.float64)
    all_reduce(table, "the per-stage report allreduce", dist.ReduceOp.MAX)
    return [{"stage": k, "busy_s": float(row[0]), "wait_s": float(row[1]),
             "busy_fraction": float(row[0]) / wall_s if wall_s > 0 else 0.0,
             "staleness_achieved": int(row[2]), "staleness_planned": int(plan.pipeline.staleness[k]),
             "slowdown": float(slowdowns.get(k, 1.0))}
            for k, row in enumerate(table)]


def _verified(options: RunOptions, plan: Plan, dtype: torch.dtype, device: torch.device) -> dict[str, object]:
    """``--verify``, run again in float64 where it fails in a narrower dtype (``runtime.verify.recheck_in_float64``)."""
    from runtime.verify import recheck_in_float64

    wide = replace(options, dtype="float64", tolerance=1e-9, amp="")
    return recheck_in_float64(_verify(options, plan, dtype, device), dtype,
                              lambda: _verify(wide, plan, torch.float64, device))


def _verify(options: RunOptions, plan: Plan, dtype: torch.dtype, device: torch.device) -> dict[str, object]:
    """One iteration without its update against the unsplit model on the same micro-batches (module docstring)."""

    keep_references_of(reference_identity(options), options.leaf_modules)
    if plan.pipeline.schedule == "stale":
        plan = _capped(plan, 0)
    stage = _build(options, plan, dtype, device, sync_batchnorm=True)
    stage.switch_off_random = True
    stage.keep_outputs = True
    events = _events(options, plan, stage)
    micro = plan.pipeline.micro_batches if plan.pipeline.schedule == "sync" else 1
    keys = _keys(options, stage, 0)
    with inside_switched_off(stage.model.model, stage.model.random.values()):
        stage.run([e for e in events if e.kind != "U"], sgd(stage.parameters(), lr=0.0),
                  lambda b: _load(options, stage, 0, b, dtype, device), last_backward=micro - 1, keys=keys)
    batches = [(*_whole(options, stage, b, dtype, device), keys(b)) for b in range(micro)]
    reuse = reference_identity(options)
    reference = shared_reference(lambda d: fresh_model(options, d, device), options.leaf_modules, dtype, batches,
                                 reuse=reuse, device=device, output=options.output, loss=options.loss,
                                 wanted=compared_parameters(stage.model))
    noise = (shared_rounding(reference, lambda: reference_step(lambda d: fresh_model(options, d, device),
                                                               options.leaf_modules, torch.float64, batches,
                                                               reuse=reuse, output=options.output,
                                                               loss=options.loss), device)
             if dtype.itemsize < 8 else None)
    comparison = Comparison.of(reference, dtype, options.tolerance, noise=noise)
    for b in range(micro) if stage.last else ():
        compare_outputs(comparison, stage.model_for(b), stage.outputs[b], reference.outputs[b])
    shares = sum((float(loss) * stage.loss_scale(b) for b, loss in enumerate(stage.losses)), 0.0)
    comparison.loss(stage.model.global_value(torch.tensor(shares, dtype=torch.float64, device=device)),
                    reference.loss)  # every rank: the last stage's shares, the others' zero
    compare_gradients(comparison, stage.model, reference.model)
    return comparison.report(device) | random_report(reference.random)


def _whole(options: RunOptions, stage: PipelineStage, micro: int, dtype: torch.dtype, device: torch.device
           ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """The whole micro-batch ``micro`` of step 0 (every input) and its labels (the unsplit model's)."""
    part = stage.model_for(micro)
    output_shape = part.layer_graph.nodes[part.output_name].output_shape
    first = stage.first_sample(micro)
    samples = slice(first, first + stage.samples(micro))
    x_boxes = tuple((samples, *(slice(0, e) for e in shape[1:])) for shape in options.shapes)
    t_box = (samples, *(slice(0, e) for e in target_shape(options.target, output_shape)[1:]))
    return _batch(options, output_shape, x_boxes, t_box, 0, dtype, device)
