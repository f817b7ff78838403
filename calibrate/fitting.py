"""Least-squares fits in relative error, and held-out error reporting, shared by compute and comm fits.

Every model parplan fits is linear in non-negative coefficients,
``t ≈ Σ_j x_j · c_j`` (an overhead, seconds per FLOP and per byte; or α and β).
We minimise the *relative* residuals ``Σ ((x·c − t) / t)²`` with
``scipy.optimize.nnls`` on rows scaled by ``1/t``, so a 10 µs kernel counts as
much as a 1 s one, and coefficients stay physical (never negative).

Errors are reported on samples the model was not fitted to: a deterministic
split puts every ``holdout_every``-th sample (in a fixed order) aside, fits on
the rest, and measures the relative error on the held-out ones; the model that
is saved is then refitted on all samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import nnls

from cost_models.profile import FitError

__all__ = ["fit_relative_nnls", "heldout_error", "holdout_split", "predict"]


def fit_relative_nnls(rows: Sequence[Sequence[float]], measured_s: Sequence[float]) -> np.ndarray:
    """Non-negative coefficients ``c`` minimising ``Σ ((row·c − t)/t)²``.

    Args:
        rows: One design row per sample (e.g. ``[1, flops, bytes]``).
        measured_s: The measured seconds, all > 0.

    Returns:
        The coefficient vector, one entry per column.
    """
    design = np.asarray(rows, dtype=float)
    target = np.asarray(measured_s, dtype=float)
    if design.ndim != 2 or len(design) != len(target) or len(target) == 0:
        raise ValueError(f"need one design row per sample, got {design.shape} rows for {len(target)} samples")
    if np.any(target <= 0):
        raise ValueError("measured times must be positive")
    scale = design.max(axis=0)
    scale[scale == 0] = 1.0  # an all-zero column keeps coefficient 0
    weighted = design / scale / target[:, None]
    coefficients, _ = nnls(weighted, np.ones_like(target), maxiter=50 * design.shape[1])
    return coefficients / scale


def predict(rows: Sequence[Sequence[float]], coefficients: np.ndarray) -> list[float]:
    """``row · coefficients`` for each row."""
    return [float(v) for v in np.asarray(rows, dtype=float) @ coefficients]


def holdout_split(count: int, holdout_every: int = 4) -> tuple[list[int], list[int]]:
    """Indices ``(train, held_out)``: every ``holdout_every``-th index (from 1) is held out.

    With fewer than ``2·holdout_every`` samples nothing is held out: the fit
    needs them all, and its error is then reported as not measured.
    """
    if count < 2 * holdout_every:
        return list(range(count)), []
    held = set(range(1, count, holdout_every))
    return [i for i in range(count) if i not in held], sorted(held)


def heldout_error(rows: Sequence[Sequence[float]], measured_s: Sequence[float],
                  holdout_every: int = 4) -> tuple[FitError, list[float], list[float]]:
    """Fit on the training part, evaluate on the held-out part.

    Returns:
        The error on held-out samples, and the (predicted, measured) lists it
        was computed from, so callers can pool them across models.
    """
    train, held = holdout_split(len(measured_s), holdout_every)
    if not held:
        return FitError(None, None, 0), [], []
    coefficients = fit_relative_nnls([rows[i] for i in train], [measured_s[i] for i in train])
    predicted = predict([rows[i] for i in held], coefficients)
    measured = [float(measured_s[i]) for i in held]
    return FitError.of(predicted, measured), predicted, measured
