"""One attempt of ``parplan run`` and its checkpoints: where it starts, when it saves, what it reports.

* ``--checkpoint-every N --checkpoint-dir D``: after every ``N``-th update
  (warm-up included) all ranks write a checkpoint (``runtime.checkpoint``).
* ``--resume``: start from the newest complete checkpoint in ``D`` whose
  shards are intact (a damaged one is passed over, with one line naming it).
* A group that torchrun's agent restarted (``--max-restarts``: the job's
  attempt, ``processes.job.job_attempt``, is past 0) resumes from it too, or
  starts over when no checkpoint was complete yet.

The step's data is drawn from the seed and the step number, and the RNG
state is in the checkpoint, so a resumed run's losses are those of the run it
continues. The measurement's ``recovery`` block says where this attempt
started, how many restarts preceded it and which checkpoints it wrote.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from cost_models.errors import InputError
from processes.job import job_attempt
from runtime.checkpoint import (
    Progress,
    RunMeta,
    State,
    check_compatible,
    complete,
    read_manifest,
    restore,
    run_flags,
    save,
    usable,
)
from runtime.waiting import all_reduce

if TYPE_CHECKING:
    from runtime.apply import DistributedModel
    from runtime.options import RunOptions
    from runtime.pipeline.stash import InFlight

__all__ = ["Recovery", "training_state"]


def training_state(split: DistributedModel, optimizer: torch.optim.Optimizer,
                   buffers: list[torch.Tensor] | None = None) -> State:
    """The named parameters this rank trains, its buffers (``buffers``: only these) and their slices."""
    model: nn.Module = split.model
    own = {id(p) for p in split.own_parameters}
    kept = None if buffers is None else {id(b) for b in buffers}
    return State(parameters={n: p for n, p in model.named_parameters() if id(p) in own},
                 buffers={n: b for n, b in model.named_buffers() if kept is None or id(b) in kept},
                 slices={piece.name: piece for piece in split.slices}, optimizer=optimizer)


class Recovery:
    """Checkpoints and resume for this attempt (see the module docstring)."""

    def __init__(self, options: RunOptions, state: State, device: torch.device) -> None:
        self.options, self.state, self.device = options, state, device
        self.restarts = job_attempt()
        self.resumed_from: int | None = None
        self.in_flight: InFlight | None = None
        """This rank's batches in flight at the checkpoint resumed from (a stale pipeline's), if it continues them."""
        self.written: list[int] = []
        self.seconds: list[float] = []

    def start(self) -> Progress:
        """The progress to continue from: a checkpoint's, loaded into the state, or a fresh start."""
        directory = self.options.checkpoint_dir
        if not directory or not (self.options.resume or self.restarts > 0):
            return Progress()
        manifest = self._newest_usable(directory)
        if manifest is None:
            if self.options.resume and self.restarts == 0:
                raise InputError(f"--resume: {directory} holds no complete checkpoint; run without --resume")
            if dist.get_rank() == 0:
                print(f"parplan: attempt {self.restarts} resumes from step 0 (no complete checkpoint in {directory} "
                      "yet)", file=sys.stderr, flush=True)
            return Progress()
        check_compatible(manifest, {**self.meta(), "steps": self.options.steps})
        progress, self.in_flight = restore(manifest, self.state, self.meta(), self.device)
        self.resumed_from = progress.step
        if dist.get_rank() == 0:
            print(f"parplan: attempt {self.restarts} resumes from step {progress.step} ({manifest['folder']})",
                  file=sys.stderr, flush=True)
        return progress

    def _newest_usable(self, directory: str) -> dict[str, object] | None:
        """The newest complete checkpoint every rank can load its part of (collective); a damaged one is passed
        over, the lowest rank that found the damage saying so in one line."""
        world = dist.get_world_size()
        found = complete(directory)
        for folder in reversed(found):
            manifest = read_manifest(folder)
            why = usable(manifest, self.meta())
            first = torch.tensor([world if why is None else dist.get_rank()], device=self.device)
            all_reduce(first, "the ranks' check of the checkpoint", dist.ReduceOp.MIN)
            if int(first.item()) == world:
                return manifest
            if why is not None and int(first.item()) == dist.get_rank():
                print(f"parplan: warning: passing over the damaged checkpoint {folder}: {why}", file=sys.stderr,
                      flush=True)
        if found:
            raise InputError(f"every checkpoint in {directory} is damaged (the newest, {found[-1]}, and those "
                             "before it); start afresh in an empty --checkpoint-dir")
        return None

    def due(self, step: int) -> bool:
        """Whether a checkpoint is due after ``step`` updates (a multiple of ``--checkpoint-every``)."""
        every = self.options.checkpoint_every
        return bool(every and self.options.checkpoint_dir and step % every == 0)

    def after_step(self, progress: Progress, in_flight: InFlight | None = None) -> None:
        """Write a checkpoint when :meth:`due` (collective); ``in_flight``: this rank's batches in flight."""
        if self.due(progress.step):
            started = time.perf_counter()
            save(self.options.checkpoint_dir, progress, self.state, self.meta(), in_flight)
            self.seconds.append(time.perf_counter() - started)
            self.written.append(progress.step)

    def meta(self) -> RunMeta:
        """What a checkpoint records of this run and a resume must match (or, for ``run``, keeps)."""
        return {"plan": self.options.plan, "seed": self.options.seed, "warmup": self.options.warmup,
                "run": run_flags(checkpoint_every=self.options.checkpoint_every, order=self.options.order,
                                 staleness=self.options.staleness, lr=self.options.lr)}

    def report(self) -> dict[str, object]:
        """The measurement's ``recovery`` block."""
        return {"resumed_from_step": self.resumed_from, "restarts": self.restarts,
                "checkpoint_dir": self.options.checkpoint_dir or None, "checkpoints": list(self.written),
                "checkpoint_s": list(self.seconds)}
