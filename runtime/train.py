"""What every rank of ``parplan run`` does: build the model, apply the plan, verify, train, measure.

:func:`worker` runs inside an initialised default process group (torchrun's
machinery or MPI set it up, ``runtime.launch``) and returns, on rank 0, the
measurement document (``parplan.measurement/1``); other ranks return
``None``. One step is forward, :meth:`DistributedModel.loss`, backward (with
the gradient sums over replica groups) and an SGD update; its time is the
slowest rank's wall time, taken after a barrier-free step by an allreduce of
the per-rank times (so the measurement adds one tiny collective per step).

``verify`` runs one step of the split model and of the unsplit model on the
same synthetic batch and seed, random layers on in both with the same keyed
draws, batch-norm synchronised over the whole batch (only then can a sample
split equal the unsplit model), and compares every output and gradient
(``runtime.verify``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from processes.cores import pin_rank
from processes.heap import steady_heap
from processes.job import launcher_of, place_in_job
from runtime.batches import Batch, factory_batches, synthetic_inputs, synthetic_target
from runtime.checkpoint import Progress
from runtime.fault_injection import planned, strike
from runtime.losses import resolve_loss, target_shape
from runtime.measurement import (
    device_of_rank,
    largest_over_ranks,
    measurement_document,
    peak_memory_bytes,
    synchronise,
    verify_only,
)
from runtime.memory_peak import held_tensors, peak_tensor_bytes
from runtime.options import PER_LAYER_STEPS, RunOptions
from runtime.pipeline.worker import pipeline_worker
from runtime.precision import Precision, autocast
from runtime.random_ops import DrawKey
from runtime.recovery import Recovery, training_state
from runtime.seeded_model import fresh_model, reference_identity, sgd
from runtime.waiting import all_reduce, at

if TYPE_CHECKING:
    from cost_models.formats.plan import Plan
    from runtime.apply import DistributedModel
    from runtime.layer_times import LayerTimes

__all__ = ["worker"]

def worker(options: RunOptions) -> dict[str, object] | None:
    """Run on every rank; returns the measurement document on rank 0."""
    from cost_models.formats.plan import Plan

    if options.threads:
        torch.set_num_threads(options.threads)
    _pin(options)
    steady_heap()
    device = device_of_rank()
    plan = Plan.from_dict(options.plan)
    if plan.pipeline.pipelined:
        return pipeline_worker(options, plan, device)
    dtype = getattr(torch, options.dtype)
    verified = _verified(options, plan, dtype, device) if options.verify else None
    if options.verify and options.warmup + options.steps == 0:
        return verify_only(options, plan, verified, device)
    _, split = _build(options, plan, dtype, device)
    optimizer = sgd(split.parameters(), lr=options.lr)
    batch = _data_source(options, split, dtype, device)
    recovery = Recovery(options, training_state(split, optimizer), device)
    precision = Precision.of(options.amp, device)
    progress = _train(options, plan, split, optimizer, batch, precision, recovery)
    peak = _peak_tensors(options, split, optimizer, batch, precision) if options.steps else None
    layers = _layer_times(options, split, optimizer, batch, precision) if options.per_layer else None
    if options.trace:
        _trace(options, split, optimizer, batch, precision)
    memory = peak_memory_bytes(device)
    if dist.get_rank() != 0:
        return None
    document = measurement_document(options, plan, progress.per_step_s, progress.losses, memory, verified, peak)
    document["recovery"] = recovery.report()
    if layers is not None:
        document["layers"] = layers
    return document


def _train(options: RunOptions, plan: Plan, split: DistributedModel, optimizer: torch.optim.Optimizer, batch: Batch,
           precision: Precision, recovery: Recovery) -> Progress:
    """The warm-up and timed steps not done yet (``recovery`` says where to start), a checkpoint when due."""
    progress = recovery.start()
    fault = planned()
    for step in range(progress.step, options.warmup + options.steps):
        strike(fault, dist.get_rank(), step + 1)
        with at(f"step {step + 1}"):
            seconds, loss = _step(split, optimizer, batch(step), precision, DrawKey(options.seed, step))
        progress.step = step + 1
        if step >= options.warmup:
            progress.per_step_s.append(seconds)
            progress.losses.append(loss)
            _progress(options, step - options.warmup, seconds, loss, plan)
        recovery.after_step(progress)
    return progress


def _peak_tensors(options: RunOptions, split: DistributedModel, optimizer: torch.optim.Optimizer, batch: Batch,
                  precision: Precision) -> int:
    """One more step, measuring its peak bytes of live tensors (``runtime.memory_peak``); the largest rank's."""
    step = options.warmup + options.steps
    optimizer.zero_grad(set_to_none=True)
    device = precision.device
    held = held_tensors(split, optimizer, *split.gradients.buffers())
    return largest_over_ranks(peak_tensor_bytes(
        lambda: _step(split, optimizer, batch(step), precision, DrawKey(options.seed, step)), device, held), device)


def _layer_times(options: RunOptions, split: DistributedModel, optimizer: torch.optim.Optimizer, batch: Batch,
                 precision: Precision) -> list[LayerTimes]:
    """Per layer forward/backward seconds over ``PER_LAYER_STEPS`` further steps under the profiler."""
    from runtime.layer_times import profiled_layer_times

    def one_step(step: int) -> None:
        _step(split, optimizer, batch(step), precision, DrawKey(options.seed, step))

    first = options.warmup + options.steps + 1  # after the memory step
    return profiled_layer_times(split, one_step, range(first, first + PER_LAYER_STEPS), precision.device)


def _trace(options: RunOptions, split: DistributedModel, optimizer: torch.optim.Optimizer, batch: Batch,
           precision: Precision) -> None:
    """One more step under the profiler; rank 0 writes its trace to ``options.trace``."""
    from runtime.layer_times import profiled_trace

    def one_step(step: int) -> None:
        _step(split, optimizer, batch(step), precision, DrawKey(options.seed, step))

    after = options.warmup + options.steps + 1 + (PER_LAYER_STEPS if options.per_layer else 0)
    profiled_trace(split, one_step, after, precision.device, options.trace)


def _build(options: RunOptions, plan: Plan, dtype: torch.dtype,
           device: torch.device) -> tuple[nn.Module, DistributedModel]:
    from runtime.apply import apply_plan

    model = fresh_model(options, dtype, device)  # the same initial weights on every rank
    split = apply_plan(model, plan, sync_batchnorm=options.sync_batchnorm, leaf_modules=options.leaf_modules,
                       graph=options.graph, timeout=options.timeout, random_seed=options.seed, output=options.output)
    split.loss_fn = resolve_loss(options.loss)
    return model, split


def _data_source(options: RunOptions, split: DistributedModel, dtype: torch.dtype, device: torch.device,
                 whole: bool = False) -> Batch:
    """Step → this rank's (inputs, labels); with ``whole``, the whole batch (the unsplit model's, for --verify)."""
    output_shape = split.layer_graph.nodes[split.output_name].output_shape
    label_shape = target_shape(options.target, output_shape)
    input_boxes, label_box = split.input_boxes(), split.target_box(label_shape)
    if whole:
        input_boxes, label_box = tuple(_everything(shape) for shape in options.shapes), _everything(label_shape)
    if options.data:
        return factory_batches(options.data, input_boxes, label_box, dtype, device)

    def synthetic(step: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        seed = options.seed * 1000 + step
        return (synthetic_inputs(options.shapes, input_boxes, seed, dtype, device),
                synthetic_target(label_shape, label_box, output_shape[1], seed, dtype, device,
                                 regression=options.target == "output"))

    return synthetic


def _step(split: DistributedModel, optimizer: torch.optim.Optimizer,
          batch: tuple[tuple[torch.Tensor, ...], torch.Tensor], precision: Precision,
          key: DrawKey) -> tuple[float, float]:
    inputs, target = batch
    device = precision.device
    split.draw_key = key  # the step's random draws: the same on a resumed run
    synchronise(device)
    started = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    with at("forward"), precision.forward():
        share = split.loss(split(*inputs), target)
    with at("backward"):
        precision.backward(share)
    precision.step(optimizer)
    synchronise(device)
    elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64, device=device)
    all_reduce(elapsed, "the step-time allreduce", dist.ReduceOp.MAX)
    return float(elapsed.item()), split.global_value(share)


def _pin(options: RunOptions) -> None:
    """This rank's threads on cores of their own (``processes.cores.pin_rank``), where its launcher says which
    local rank it is (torchrun, parplan's own, Slurm) and ``mpirun`` did not start it (it binds by itself)."""
    place = place_in_job() if launcher_of() != "mpi" else None
    if place is not None:
        pin_rank(place.local_rank, place.local_world_size, options.threads or torch.get_num_threads())


def _verified(options: RunOptions, plan: Plan, dtype: torch.dtype, device: torch.device) -> dict[str, object]:
    """``--verify``, run again in float64 where it fails in a narrower dtype (``runtime.verify.recheck_in_float64``)."""
    from runtime.verify import recheck_in_float64

    wide = replace(options, dtype="float64", tolerance=1e-9, amp="")
    return recheck_in_float64(_verify(options, plan, dtype, device), dtype,
                              lambda: _verify(wide, plan, torch.float64, device))


def _verify(options: RunOptions, plan: Plan, dtype: torch.dtype, device: torch.device) -> dict[str, object]:
    """One step of the split and of the unsplit model on the same batch and keyed draws (``runtime.verify``)."""
    from runtime.random_ops import inside_switched_off
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

    keep_references_of(reference_identity(options), options.leaf_modules)
    _, split = _build(replace(options, sync_batchnorm=True), plan, dtype, device)
    key = DrawKey(options.seed, 0)
    split.draw_key, split.switch_off_random = key, True
    inputs, target = _data_source(options, split, dtype, device)(0)
    with inside_switched_off(split.model, split.random.values()):
        with autocast(options.amp, device):
            output = split(*inputs)
            share = split.loss(output, target)
        share.backward()
    full_inputs, labels = _data_source(options, split, dtype, device, whole=True)(0)
    batches = [(full_inputs, labels, key)]
    reuse = reference_identity(options)
    reference = shared_reference(lambda d: fresh_model(options, d, device), options.leaf_modules, dtype, batches,
                                 reuse=reuse, device=device, output=options.output, amp=options.amp,
                                 loss=options.loss, wanted=compared_parameters(split))
    noise = (shared_rounding(reference, lambda: reference_step(lambda d: fresh_model(options, d, device),
                                                               options.leaf_modules, torch.float64, batches,
                                                               reuse=reuse, output=options.output,
                                                               loss=options.loss), device)
             if dtype.itemsize < 8 else None)
    comparison = Comparison.of(reference, dtype, options.tolerance, noise=noise)
    compare_outputs(comparison, split, output, reference.outputs[0])
    comparison.loss(split.global_value(share), reference.loss)
    compare_gradients(comparison, split, reference.model)
    return comparison.report(device) | random_report(reference.random)


def _everything(shape: Sequence[int]) -> tuple[slice, ...]:
    return tuple(slice(0, int(extent)) for extent in shape)


def _progress(options: RunOptions, step: int, seconds: float, loss: float, plan: Plan) -> None:
    if options.quiet or dist.get_rank() != 0:
        return
    predicted = f", predicted {plan.predicted.iteration_s * 1e3:.2f} ms" if plan.predicted else ""
    print(f"step {step + 1}/{options.steps}: {seconds * 1e3:.2f} ms, loss {loss:.6f}{predicted}", file=sys.stderr,
          flush=True)


