"""Corrections a profile carries after ``parplan validate --refine``: what calibration alone does not see.

Calibration times kernels and collectives one at a time. A whole training
step adds what neither measures: the runtime's own implementation of a split
(parplan's batch-norm over tiles, a convolution computed as interior and
border bands, halo copies), ranks sharing cores, the optimizer's update,
Python's per-event cost in a pipeline schedule. ``Corrections`` hold four
kinds of terms fitted to measured runs:

* ``layer_scale``: per layer key (:func:`layer_key`: the kind, and how the
  layout splits it), a factor on the layer's local seconds — compute, exposed
  halo, norm statistics and channel reduction (not the redistribution into
  it, which is priced on the edge).
  Keys not fitted fall back to ``*`` with the same split (the pooled factor),
  then to ``*`` alone, then to 1.
* ``step_overhead_s``: seconds added once per iteration.
* ``event_overhead_s``: seconds added to every stage's forward and backward of
  each micro-batch (pipelines: one event each).
* ``allreduce_exposed_fraction``: the share of the weight-gradient allreduce
  time the overlap timeline hides behind backward that measured runs did not
  hide (0: overlap as modelled; 1: none). Where ranks share cores, gloo's
  communication threads take cycles from the backward they should overlap.

Assumptions: the factors are the same for every size of the same key (they
are ratios of measured to predicted sums over the layers they were fitted
on); weight-gradient allreduces and stage transfers are not scaled (they are
timed as the collectives they are).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cost_models.layout import Layout

__all__ = ["POOLED", "Corrections", "layer_key", "split_class"]

POOLED = "*"


def split_class(layout: Layout) -> str:
    """How ``layout`` cuts a layer's own work: ``""`` (whole samples), ``spatial``, ``channel`` or both."""
    parts = (["channel"] if layout.c > 1 else []) + (["spatial"] if layout.spatial > 1 else [])
    return "·".join(parts)


def layer_key(kind: str, layout: Layout) -> str:
    """``conv``, ``conv·spatial``, ``batchnorm·channel`` …: the key of :attr:`Corrections.layer_scale`."""
    split = split_class(layout)
    return f"{kind}·{split}" if split else kind


@dataclass(frozen=True)
class Corrections:
    """Fitted factors (see the module docstring); ``fitted_on`` records which runs they came from."""

    layer_scale: Mapping[str, float] = field(default_factory=dict)
    step_overhead_s: float = 0.0
    event_overhead_s: float = 0.0
    allreduce_exposed_fraction: float = 0.0
    fitted_on: Mapping[str, Any] = field(default_factory=dict)

    def scale(self, kind: str, layout: Layout) -> float:
        """The factor for a layer of ``kind`` under ``layout``: its key's, else its split's pooled one, else
        ``*``'s, else 1."""
        for key in (layer_key(kind, layout), layer_key(POOLED, layout), POOLED):
            if key in self.layer_scale:
                return self.layer_scale[key]
        return 1.0

    def to_dict(self) -> dict[str, object]:
        """The profile's ``corrections`` block."""
        return {"layer_scale": dict(sorted(self.layer_scale.items())), "step_overhead_s": self.step_overhead_s,
                "event_overhead_s": self.event_overhead_s,
                "allreduce_exposed_fraction": self.allreduce_exposed_fraction, "fitted_on": dict(self.fitted_on)}

    @classmethod
    def from_dict(cls, block: Mapping[str, Any]) -> Corrections:
        """From a (schema-checked) ``corrections`` block."""
        return cls(dict(block["layer_scale"]), float(block["step_overhead_s"]), float(block["event_overhead_s"]),
                   float(block["allreduce_exposed_fraction"]), dict(block["fitted_on"]))
