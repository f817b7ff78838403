"""Fitting the compute model to timed local problems.

Per (layer kind, pass) the model ``t = overhead_s + flops·s_per_flop +
bytes·s_per_byte`` is fitted in relative error (``calibrate.fitting``), its
error measured on held-out problems, then refitted on all of them. A pooled
fit of kind ``*`` per pass covers kinds that were not timed. The pooled error
of all held-out predictions is the profile's ``fit.compute``.
"""

from __future__ import annotations

from collections.abc import Sequence

from calibrate.fitting import fit_relative_nnls, heldout_error
from cost_models.profile import POOLED_KIND, ComputeFit, ComputeSample, FitError

__all__ = ["fit_compute"]

MIN_SAMPLES_PER_FIT = 3


def fit_compute(samples: Sequence[ComputeSample], holdout_every: int = 4) -> tuple[list[ComputeFit], FitError]:
    """Fits per (kind, pass) and pooled per pass, and the pooled held-out error.

    Args:
        samples: Timed problems.
        holdout_every: Every k-th problem of a group (ordered by FLOPs, then bytes) is held out.

    Returns:
        The fits (kinds with fewer than ``MIN_SAMPLES_PER_FIT`` samples get none
        of their own), and the error over all held-out problems.
    """
    groups: dict[tuple[str, str], list[ComputeSample]] = {}
    for sample in samples:
        groups.setdefault((sample.kind, sample.phase), []).append(sample)
        groups.setdefault((POOLED_KIND, sample.phase), []).append(sample)
    fits: list[ComputeFit] = []
    predicted: list[float] = []
    measured: list[float] = []
    for (kind, phase), group in sorted(groups.items()):
        if len(group) < MIN_SAMPLES_PER_FIT:
            continue
        fit, held_predicted, held_measured = _fit_group(kind, phase, group, holdout_every)
        fits.append(fit)
        if kind != POOLED_KIND:
            predicted += held_predicted
            measured += held_measured
    return fits, FitError.of(predicted, measured)


def _fit_group(kind: str, phase: str, group: list[ComputeSample],
               holdout_every: int) -> tuple[ComputeFit, list[float], list[float]]:
    ordered = sorted(group, key=lambda s: (s.flops, s.bytes, s.key))
    rows = [[1.0, float(s.flops), float(s.bytes)] for s in ordered]
    times = [s.median_s for s in ordered]
    error, held_predicted, held_measured = heldout_error(rows, times, holdout_every)
    overhead, per_flop, per_byte = (float(c) for c in fit_relative_nnls(rows, times))
    fit = ComputeFit(kind, phase, overhead, per_flop, per_byte, n_train=len(ordered), error=error)
    return fit, held_predicted, held_measured
