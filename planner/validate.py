"""How far predictions are from measurements: relative errors, rank agreement, and the cost of trusting the planner.

For plans ``i`` with predicted seconds ``p_i`` and measured seconds ``m_i``:

* relative error ``|p_i − m_i| / m_i`` (and the signed ``(p_i − m_i) / m_i``:
  negative when the model is optimistic); their median and 90th percentile;
* Kendall's τ-b between the predicted and the measured order (1: the same
  order; ties count half, as ``scipy.stats.kendalltau``);
* regret of the planner's first choice: ``m_first / min_i m_i − 1`` (0 when
  the plan the planner would run is the fastest measured).

The same figures over the plans a profile's calibration did not run
(:func:`unseen_accuracy`): what it predicts of plans it never saw.

And what the runs' machine does to every prediction: ranks that together
use every core of their host share them, with their communication too
(``processes.cores.shared_cores``).

Pure functions on numbers; no torch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.stats import kendalltau

__all__ = ["Accuracy", "accuracy", "percentile", "relative_errors", "unseen_accuracy"]


@dataclass(frozen=True)
class Accuracy:
    """Median and p90 relative error, Kendall's τ, the first choice's regret, over ``n`` plans."""

    median_rel_err: float
    p90_rel_err: float
    kendall_tau: float | None
    regret: float
    n: int

    def short(self) -> str:
        """``median 6.1% · p90 14.0% · τ 0.87 · regret 0.0% (n=9)``."""
        tau = "n/a" if self.kendall_tau is None else f"{self.kendall_tau:.2f}"
        return (f"median {self.median_rel_err:.1%} · p90 {self.p90_rel_err:.1%} · τ {tau} · "
                f"regret {self.regret:.1%} (n={self.n})")

    def to_dict(self) -> dict[str, float | int | None]:
        """The JSON fields of ``parplan validate`` (``median_rel_err``, ``kendall_tau``, ``regret``; docs/commands.md)
        and ``p90_rel_err``."""
        return {"median_rel_err": self.median_rel_err, "p90_rel_err": self.p90_rel_err,
                "kendall_tau": self.kendall_tau, "regret": self.regret, "n": self.n}


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    """Signed ``(p − m) / m`` per plan.

    Raises:
        ValueError: Different lengths, or a measured time that is not positive.
    """
    if len(predicted) != len(measured):
        raise ValueError(f"{len(predicted)} predictions for {len(measured)} measurements")
    if any(m <= 0 for m in measured):
        raise ValueError(f"measured times must be positive, got {min(measured)}")
    return [(p - m) / m for p, m in zip(predicted, measured)]


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile with linear interpolation between order statistics (numpy's default)."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def accuracy(predicted: Sequence[float], measured: Sequence[float], first: int = 0) -> Accuracy:
    """The figures of the module docstring; ``first`` indexes the planner's choice."""
    errors = [abs(e) for e in relative_errors(predicted, measured)]
    if not errors:
        raise ValueError("no plans to compare")
    tau = None
    if len(errors) >= 2:
        value = kendalltau(predicted, measured).statistic
        tau = None if math.isnan(value) else float(value)
    return Accuracy(statistics.median(errors), percentile(errors, 0.9), tau, measured[first] / min(measured) - 1,
                    len(errors))


def unseen_accuracy(seen: Sequence[bool], predicted: Sequence[float], measured: Sequence[float]) -> Accuracy | None:
    """The figures over the plans not ``seen`` (those calibration did not run), the first choice being the one of
    them predicted fastest; ``None`` when every plan was seen."""
    others = [i for i, was_seen in enumerate(seen) if not was_seen]
    if not others:
        return None
    first = min(range(len(others)), key=lambda k: predicted[others[k]])
    return accuracy([predicted[i] for i in others], [measured[i] for i in others], first)
