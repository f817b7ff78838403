"""What the training loss adds to a step (``parplan run --loss``), priced on the stage that computes it.

Assumptions:

* a loss moves a fixed number of bytes per element of the output box it is taken of, forward and backward
  (``runtime.losses.loss_cost`` counts them once, on a small output of the model's class count), at the rate
  of the profile's ``elementwise`` model (no flops);
* what it keeps for its backward is alive at the stage's peak (the end of the forward);
* each sum it keeps per sample and class (a Dice loss's overlap and totals, not the final mean) is one
  allreduce forward and one backward over the ranks that split the output's positions (samples, depth, rows,
  columns), of the few bytes the probe's sums held — latency, mostly (``runtime.split_loss``); a final mean
  costs nothing (each rank's partial sum is its share);
* the default cross-entropy is not recorded: its cost is part of the step that calibration's corrections
  were fitted to.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from math import prod
from typing import Any

from cost_models.layout import Layout
from cost_models.profile import Profile

__all__ = ["LossCost", "LossSeconds"]


@dataclass(frozen=True)
class LossSeconds:
    """A loss's seconds per micro-batch on its stage, and the bytes it holds there."""

    forward_s: float
    backward_s: float
    held_bytes: int


@dataclass(frozen=True)
class LossCost:
    """A loss measured per element of its output: bytes moved forward and backward, bytes kept for the
    backward, and its sums over positions (count and bytes each)."""

    forward_bytes_per_element: float
    backward_bytes_per_element: float
    saved_bytes_per_element: float
    global_sums: int
    sum_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LossCost:
        return cls(**data)

    def seconds(self, profile: Profile, layout: Layout, output_shape: tuple[int, ...]) -> LossSeconds:
        """Per micro-batch, on each rank holding a box of the ``output_shape`` output under ``layout``."""
        elements = prod(layout.local_shape(output_shape)) if len(output_shape) in (3, 4, 5) else prod(output_shape)
        positions = layout.n * layout.d * layout.h * layout.w
        sums_s = self.global_sums * profile.comm_time_s("allreduce", "intra", positions, self.sum_bytes)
        forward = profile.compute_fit("elementwise", "fwd").time_s(0.0, self.forward_bytes_per_element * elements)
        backward = profile.compute_fit("elementwise", "bwd").time_s(0.0, self.backward_bytes_per_element * elements)
        return LossSeconds(forward + sums_s, backward + sums_s, int(self.saved_bytes_per_element * elements))
