"""``RunOptions``: everything a rank of ``parplan run`` needs, one frozen value sent whole to every rank.

The plain worker (``runtime.train``) and the pipeline worker (``runtime.pipeline.worker``) both read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph
    from processes.job import Launcher
    from runtime.losses import TargetKind

__all__ = ["PER_LAYER_STEPS", "PipelineOrder", "RunOptions"]

PipelineOrder = Literal["1f1b", "gpipe"]
"""A sync pipeline's order of micro-batches (``parplan run --order``)."""

PER_LAYER_STEPS = 3
"""Profiled steps after the timed ones when per-layer times are asked for (``RunOptions.per_layer``)."""


@dataclass(frozen=True)
class RunOptions:
    """Everything a rank needs, picklable (sent to spawned ranks)."""

    model: str
    input_shape: tuple[int, ...]
    dtype: str
    plan: dict[str, object]  # the parplan.plan/3 document
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
    launcher: Launcher = "torchrun"
    timeout_s: float = 300.0
    checkpoint_every: int = 0
    checkpoint_dir: str = ""
    resume: bool = False
    output: str | None = None  # the part of the model's output the loss is taken of (runtime.outputs); None: all
    loss: str = ""
    """The loss trained with (``--loss``, ``runtime.losses``): a built-in name or ``module:name``; empty:
    cross-entropy."""
    target: TargetKind = "classes"
    """Which target the loss takes (``runtime.losses.target_kind``, found by the command before ranks start)."""
    order: PipelineOrder = "1f1b"
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
