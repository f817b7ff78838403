"""α-β fits of timed collectives: one :class:`~cost_models.profile.CommFit` per collective and link level.

Each :class:`~cost_models.profile.CommSample` gives one design row
``(latency_count, volume_bytes)`` from :func:`cost_models.collectives.comm_terms`
and its median seconds; ``α`` (seconds per message) and ``β`` (seconds per
byte) are fitted in relative error with non-negative least squares
(:func:`calibrate.fitting.fit_relative_nnls`). The error of each model is
measured on held-out samples (:func:`calibrate.fitting.heldout_error`), and
the saved α and β are then refitted on all samples.

Samples are sorted by (collective, level, group, bytes) before the held-out
split takes every ``holdout_every``-th one, so held-out points are spread over
the sizes and groups rather than bunched at one end.

Assumptions: the samples of one collective on one link level share α and β
whatever the group size (the algorithm terms carry the group's effect);
samples of a one-rank group (nothing to time) or with a non-positive time are
left out; a model with fewer than ``2·holdout_every`` samples keeps them all
for fitting and reports its error as not measured.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import groupby

from calibrate.fitting import fit_relative_nnls, heldout_error
from cost_models.collectives import comm_terms
from cost_models.profile import CommFit, CommSample, FitError

__all__ = ["fit_comm"]


def fit_comm(samples: Sequence[CommSample], holdout_every: int = 4) -> tuple[list[CommFit], FitError]:
    """α-β fits per (collective, level), and the error pooled over all held-out samples.

    Args:
        samples: Timed collectives, in any order.
        holdout_every: Every ``holdout_every``-th sample of a model (in sorted
            order) is held out to measure its error.

    Returns:
        The fits, sorted by collective and level, and one :class:`FitError`
        over every held-out (predicted, measured) pair of every fit.
    """
    fits: list[CommFit] = []
    predicted: list[float] = []
    measured: list[float] = []
    for (collective, level), members in _by_model(samples):
        fit, held_predicted, held_measured = _fit_one(collective, level, members, holdout_every)
        fits.append(fit)
        predicted.extend(held_predicted)
        measured.extend(held_measured)
    return fits, FitError.of(predicted, measured)


def _sort_key(sample: CommSample) -> tuple[str, str, int, int]:
    return sample.collective, sample.level, sample.group, sample.bytes


def _by_model(samples: Sequence[CommSample]) -> Iterator[tuple[tuple[str, str], list[CommSample]]]:
    """Usable samples grouped by (collective, level), each group in stable sorted order."""
    usable = sorted((s for s in samples if s.group > 1 and s.median_s > 0), key=_sort_key)
    for key, members in groupby(usable, key=lambda s: (s.collective, s.level)):
        yield key, list(members)


def _fit_one(
    collective: str, level: str, samples: Sequence[CommSample], holdout_every: int
) -> tuple[CommFit, list[float], list[float]]:
    rows = [list(comm_terms(s.collective, s.group, s.bytes)) for s in samples]
    times_s = [s.median_s for s in samples]
    error, held_predicted, held_measured = heldout_error(rows, times_s, holdout_every)
    alpha_s, beta_s_per_byte = (float(c) for c in fit_relative_nnls(rows, times_s))
    fit = CommFit(collective, level, alpha_s, beta_s_per_byte, n_train=len(samples), error=error)
    return fit, held_predicted, held_measured
