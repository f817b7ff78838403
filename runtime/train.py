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

import os
import platform
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from cost_models.heap import steady_heap
from runtime.data import synthetic_inputs, synthetic_labels
from runtime.failures import all_reduce, at
from runtime.faults import planned, strike
from runtime.memory_peak import held_tensors, peak_tensor_bytes
from runtime.precision import Precision, autocast
from runtime.checkpoint import Progress
from runtime.random_ops import DrawKey
from runtime.recovery import Recovery, training_state

if TYPE_CHECKING:
    from cost_models.graph import LayerGraph

__all__ = ["PER_LAYER_STEPS", "Batch", "RunOptions", "factory_batches", "fresh_model", "largest_over_ranks",
           "measurement_document", "memory_method", "peak_memory_bytes", "peak_report", "reference_identity", "sgd",
           "synchronise", "worker"]

PER_LAYER_STEPS = 3
"""Profiled steps after the timed ones when per-layer times are asked for (``RunOptions.per_layer``)."""


@dataclass(frozen=True)
class RunOptions:
    """Everything a rank needs, picklable (sent to spawned ranks)."""

    model: str
    input_shape: tuple[int, int, int, int]
    dtype: str
    plan: dict[str, Any]  # the parplan.plan/3 document
    steps: int
    warmup: int
    lr: float = 0.01
    seed: int = 0
    verify: bool = False
    tolerance: float = 1e-3
    sync_batchnorm: bool = False
    leaf_modules: tuple[str, ...] = ()
    data: str = ""
    threads: int = 0
    quiet: bool = False
    launcher: str = "torchrun"
    timeout_s: float = 300.0
    checkpoint_every: int = 0
    checkpoint_dir: str = ""
    resume: bool = False
    output: str | None = None  # the part of the model's output the loss is taken of (runtime.outputs); None: all
    order: str = "1f1b"
    """A sync pipeline's order of micro-batches: ``1f1b`` or ``gpipe``."""
    staleness: int | None = None
    """Cap on every stage's staleness of a stale pipeline (``parplan run --staleness``); ``None``: the plan's."""
    slow_stages: tuple[tuple[int, float], ...] = ()
    """``(stage, factor)``: run that stage's events ``factor`` times slower (a simulated straggler)."""
    per_layer: bool = False
    """After the timed steps, profile a few more and report each layer's forward and backward seconds."""
    trace: str = ""
    """Where rank 0 writes the profiler's trace of one more step (Chrome trace JSON); empty: none."""
    reuse_reference: bool = False
    """Keep the unsplit reference model between runs of one rank pool (``parplan check``'s verifies)."""
    amp: str = ""
    """Mixed precision of the forward (``bf16``, ``fp16``: ``runtime.precision``); empty: the run's dtype throughout."""
    progress_file: str = ""
    """When set, rank 0 appends a line to it after this run (a progress bar of ``launch_many``'s runs reads it)."""
    graph: LayerGraph | None = field(default=None, repr=False)
    """The model's LayerGraph at ``input_shape``, traced by the command; ranks then skip tracing with fake
    tensors (and importing torch._dynamo: seconds per process). ``None``: each rank traces."""
    input_shapes: tuple[tuple[int, ...], ...] = ()
    """Every model input's shape in the forward's argument order (the first is ``input_shape``); empty: the one
    ``input_shape``."""

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """Every model input's global shape, in argument order."""
        return tuple(tuple(shape) for shape in self.input_shapes) or (tuple(self.input_shape),)

    @property
    def timeout(self) -> timedelta:
        """How long any collective or point-to-point exchange may wait for a peer."""
        return timedelta(seconds=self.timeout_s)


def sgd(parameters: Any, *, lr: float) -> torch.optim.SGD:
    """Plain SGD over ``parameters``; a rank holding none (a pipeline stage of parameter-free layers) steps an
    empty placeholder, so that every rank runs the same optimizer and checkpoint code."""
    held = list(parameters)
    return torch.optim.SGD(held or [torch.nn.Parameter(torch.zeros(0))], lr=lr)


def worker(options: RunOptions) -> dict[str, Any] | None:
    """Run on every rank; returns the measurement document on rank 0."""
    from cost_models.plan import Plan

    if options.threads:
        torch.set_num_threads(options.threads)
    steady_heap()
    device = _device()
    plan = Plan.from_dict(options.plan)
    if plan.pipeline.pipelined:
        from runtime.pipeline_train import pipeline_worker

        return pipeline_worker(options, plan, device)
    dtype = getattr(torch, options.dtype)
    verified = _verify(options, plan, dtype, device) if options.verify else None
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


def verify_only(options: RunOptions, plan: Any, verified: dict[str, Any] | None,
                device: torch.device) -> dict[str, Any] | None:
    """Rank 0's document of a run with no steps (``parplan check``'s verifies): the split is not built again."""
    memory = peak_memory_bytes(device)
    return measurement_document(options, plan, [], [], memory, verified) if dist.get_rank() == 0 else None


Batch = Callable[[int], tuple[tuple[torch.Tensor, ...], torch.Tensor]]
"""Step → this rank's boxes of the model's inputs (in argument order) and of the labels."""


def _train(options: RunOptions, plan: Any, split: Any, optimizer: torch.optim.Optimizer, batch: Batch,
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


def _peak_tensors(options: RunOptions, split: Any, optimizer: torch.optim.Optimizer, batch: Batch,
                  precision: Precision) -> int:
    """One more step, measuring its peak bytes of live tensors (``runtime.memory_peak``); the largest rank's."""
    step = options.warmup + options.steps
    optimizer.zero_grad(set_to_none=True)
    device = precision.device
    held = held_tensors(split, optimizer, *split.gradients.buffers())
    return largest_over_ranks(peak_tensor_bytes(
        lambda: _step(split, optimizer, batch(step), precision, DrawKey(options.seed, step)), device, held), device)


def largest_over_ranks(value: int, device: torch.device) -> int:
    """``value``'s maximum over every rank."""
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    all_reduce(tensor, "the peak-memory allreduce", dist.ReduceOp.MAX)
    return int(tensor.item())


def _layer_times(options: RunOptions, split: Any, optimizer: torch.optim.Optimizer, batch: Batch,
                 precision: Precision) -> list[dict[str, Any]]:
    """Per layer forward/backward seconds over ``PER_LAYER_STEPS`` further steps under the profiler."""
    from runtime.layer_times import profiled_layer_times

    def one_step(step: int) -> None:
        _step(split, optimizer, batch(step), precision, DrawKey(options.seed, step))

    first = options.warmup + options.steps + 1  # after the memory step
    return profiled_layer_times(split, one_step, range(first, first + PER_LAYER_STEPS), precision.device)


def _trace(options: RunOptions, split: Any, optimizer: torch.optim.Optimizer, batch: Batch,
           precision: Precision) -> None:
    """One more step under the profiler; rank 0 writes its trace to ``options.trace``."""
    from runtime.layer_times import profiled_trace

    def one_step(step: int) -> None:
        _step(split, optimizer, batch(step), precision, DrawKey(options.seed, step))

    after = options.warmup + options.steps + 1 + (PER_LAYER_STEPS if options.per_layer else 0)
    profiled_trace(split, one_step, after, precision.device, options.trace)


def _build(options: RunOptions, plan: Any, dtype: torch.dtype, device: torch.device) -> tuple[nn.Module, Any]:
    from runtime.apply import apply_plan

    model = fresh_model(options, dtype, device)  # the same initial weights on every rank
    return model, apply_plan(model, plan, sync_batchnorm=options.sync_batchnorm, leaf_modules=options.leaf_modules,
                             graph=options.graph, timeout=options.timeout, random_seed=options.seed,
                             output=options.output)


def _data_source(options: RunOptions, split: Any, dtype: torch.dtype, device: torch.device,
                 whole: bool = False) -> Batch:
    """Step → this rank's (inputs, labels); with ``whole``, the whole batch (the unsplit model's, for --verify)."""
    output_shape = split.layer_graph.nodes[split.output_name]["output_shape"]
    label_shape = (output_shape[0], *output_shape[2:])
    input_boxes, label_box = split.input_boxes(), split.target_box(label_shape)
    if whole:
        input_boxes, label_box = tuple(_everything(shape) for shape in options.shapes), _everything(label_shape)
    if options.data:
        return factory_batches(options.data, input_boxes, label_box, dtype, device)

    def synthetic(step: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        seed = options.seed * 1000 + step
        return (synthetic_inputs(options.shapes, input_boxes, seed, dtype, device),
                synthetic_labels(label_shape, label_box, output_shape[1], seed, device))

    return synthetic


def factory_batches(spec: str, input_boxes: tuple[tuple[slice, ...], ...], label_box: tuple[slice, ...],
                    dtype: torch.dtype, device: torch.device) -> Batch:
    """Step → the ``--data`` factory's (inputs, target) for these boxes (``runtime.data``'s contract): one input
    box and one input tensor for a single-input model, a tuple of each for a model taking several. Floating
    inputs are cast to the run's ``dtype``."""
    from cost_models.model_spec import resolve_factory

    factory = resolve_factory(spec)
    several = len(input_boxes) > 1

    def load(step: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        inputs, target = factory(input_boxes if several else input_boxes[0], label_box, step)
        return tuple(_as_input(t, dtype, device) for t in (inputs if several else (inputs,))), target.to(device)

    return load


def _as_input(tensor: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return tensor.to(device=device, dtype=dtype) if tensor.is_floating_point() else tensor.to(device)


def _step(split: Any, optimizer: torch.optim.Optimizer, batch: tuple[tuple[torch.Tensor, ...], torch.Tensor],
          precision: Precision, key: DrawKey) -> tuple[float, float]:
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


def _verify(options: RunOptions, plan: Any, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
    """One step of the split and of the unsplit model on the same batch and keyed draws (``runtime.verify``)."""
    from runtime.random_ops import inside_switched_off
    from runtime.shared_reference import shared_reference, shared_rounding
    from runtime.verify import (Comparison, compare_gradients, compare_outputs, keep_references_of, random_report,
                                reference_step)

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
                                 reuse=reuse, device=device, output=options.output, amp=options.amp)
    noise = (shared_rounding(reference, lambda: reference_step(lambda d: fresh_model(options, d, device),
                                                               options.leaf_modules, torch.float64, batches,
                                                               reuse=reuse, output=options.output), device)
             if dtype.itemsize < 8 else None)
    comparison = Comparison.of(reference, dtype, options.tolerance, noise=noise)
    compare_outputs(comparison, split, output, reference.outputs[0])
    compare_gradients(comparison, split, reference.model)
    return comparison.report(device) | random_report(reference.random)


def reference_identity(options: RunOptions) -> tuple[Any, ...] | None:
    """What identifies the unsplit reference's model and loss, when the caller lets ranks reuse it across runs
    (``RunOptions.reuse_reference``: ``parplan check``'s pool); ``None`` otherwise (a fresh one each run)."""
    return (options.model, options.seed, options.data, options.output, options.amp) if options.reuse_reference else None


def fresh_model(options: RunOptions, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """The user's model as every rank builds it (the seed's initial weights), in ``dtype``, training; kept and
    copied across the runs of a pool that reuses references (:func:`reference_identity`)."""
    from runtime.seeded_model import seeded_model

    return seeded_model(options.model, options.seed, dtype, device, reuse=reference_identity(options))


def _everything(shape: Any) -> tuple[slice, ...]:
    return tuple(slice(0, int(extent)) for extent in shape)


def _progress(options: RunOptions, step: int, seconds: float, loss: float, plan: Any) -> None:
    if options.quiet or dist.get_rank() != 0:
        return
    predicted = f", predicted {plan.predicted.iteration_s * 1e3:.2f} ms" if plan.predicted else ""
    print(f"step {step + 1}/{options.steps}: {seconds * 1e3:.2f} ms, loss {loss:.6f}{predicted}", file=sys.stderr,
          flush=True)


def measurement_document(options: RunOptions, plan: Any, per_step: list[float], losses: list[float], memory: int,
                         verified: dict[str, Any] | None, peak: int | None = None) -> dict[str, Any]:
    """Rank 0's measurement of a run (also the pipeline worker's): per-step seconds, losses, memory, verify.

    ``memory``: the largest rank's peak resident size (CPU) or allocation (CUDA); ``peak``: its peak bytes of live
    tensors over one step (``runtime.memory_peak``), reported beside the plan's predicted peak.
    """
    return {
        "format": "parplan.measurement/1",
        "model": {"spec": options.model, "input_shape": list(options.input_shape), "dtype": options.dtype,
                  "fingerprint": plan.fingerprint,
                  **({"input_shapes": [list(s) for s in options.shapes]} if len(options.shapes) > 1 else {})},
        "plan": {"summary": plan.summary(), "devices": plan.cluster.devices},
        "nproc": dist.get_world_size(), "backend": dist.get_backend(), "launcher": options.launcher,
        "steps": options.steps, "warmup": options.warmup,
        "iteration_s": statistics.median(per_step) if per_step else None,
        "per_step_s": per_step, "loss": losses,
        "predicted_iteration_s": plan.predicted.iteration_s if plan.predicted else None,
        "memory_bytes_max": memory,
        **({"memory": peak_report(peak, plan, memory_method())} if peak is not None else {}),
        "verify": verified,
        "machine": {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
                    "torch": torch.__version__, "threads_per_rank": torch.get_num_threads(),
                    "device": torch.cuda.get_device_name() if torch.cuda.is_available() and dist.get_backend() == "nccl"
                    else "cpu"},
    }


def peak_report(peak: int, plan: Any, method: str) -> dict[str, Any]:
    """The measured peak of live tensors beside the plan's predicted peak and their relative difference."""
    predicted = plan.predicted.memory_bytes_max if plan.predicted else None
    return {"peak_bytes": peak, "predicted_bytes": predicted, "method": method,
            "rel_err": (predicted - peak) / peak if predicted is not None and peak else None}


def memory_method() -> str:
    """How :func:`runtime.memory_peak.peak_tensor_bytes` measured on this run's device."""
    return "torch.cuda.max_memory_allocated" if dist.get_backend() == "nccl" else "held tensors + torch.profiler"


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank() % max(1, torch.cuda.device_count())))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_bytes(device: torch.device) -> int:
    """Largest over ranks: CUDA's peak allocation, or the process's peak resident size on CPU."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return largest_over_ranks(peak, device)
