"""What a pipeline stage keeps of a batch in flight (``runtime.pipeline.stage``), and its saved form (a stale pipeline's
checkpoint, ``runtime.pipeline.worker``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

import torch
from torch.fx.node import Argument

from cost_models.errors import PlanError
from runtime.apply import DistributedModel
from runtime.random_ops import DrawKey

__all__ = ["InFlight", "SavedStash", "Stash", "as_leaf", "crossing_tensor", "detached", "operand", "saved_stash"]


@dataclass
class Stash:
    """What a batch in flight keeps: inputs (leaves), outputs to backward, its draws' key, the RNG state, the target."""

    batch: int
    model: DistributedModel  # the stage at this batch's size
    inputs: dict[str, torch.Tensor]
    x: tuple[torch.Tensor, ...]  # the model's inputs (the first stage's boxes of them); () on other stages
    target: torch.Tensor | None
    key: DrawKey
    rng: torch.Tensor
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    loss: torch.Tensor | None = None


class SavedStash(TypedDict):
    """A batch in flight as a checkpoint holds it (:func:`saved_stash`): CPU tensors and numbers."""

    inputs: dict[str, torch.Tensor]
    x: list[torch.Tensor]
    target: torch.Tensor | None
    key: list[int]
    """The draws' key: seed, step, first sample."""
    rng: torch.Tensor


class InFlight(TypedDict):
    """A stage's batches in flight (``PipelineStage.in_flight``), by batch number: their stashes, the last stage's
    losses of them, and the crossings received ahead of their forwards."""

    stash: dict[int, SavedStash]
    losses: list[torch.Tensor]
    ahead: dict[int, dict[str, torch.Tensor]]


def saved_stash(stash: Stash) -> SavedStash:
    """What a batch in flight needs to be backwarded after a restart, as CPU tensors and numbers."""
    return {"inputs": {n: t.detach().cpu().clone() for n, t in stash.inputs.items()},
            "x": [t.detach().cpu().clone() for t in stash.x],
            "target": None if stash.target is None else stash.target.cpu().clone(),
            "key": [stash.key.seed, stash.key.step, stash.key.first_sample], "rng": stash.rng.clone()}


def as_leaf(saved: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A saved received value as the stage holds it: on its device, a leaf whose gradient goes back."""
    return saved.to(device).requires_grad_(saved.is_floating_point())


def detached(value: Argument) -> Argument:
    return value.detach() if isinstance(value, torch.Tensor) else value


def operand(received: torch.Tensor) -> torch.Tensor:
    """A received activation as the stage's layers take it: a copy when it is the leaf its gradient is read
    from (a first layer may work in place — ``x += …``, ``ReLU(inplace=True)`` — which a leaf refuses)."""
    return received.clone() if received.requires_grad else received


def crossing_tensor(value: object) -> torch.Tensor:
    tensor = getattr(value, "tensor", value)
    if not isinstance(tensor, torch.Tensor):
        raise PlanError(f"a value crossing a pipeline cut is a {type(tensor).__name__}, not a tensor; move the cut")
    return tensor
