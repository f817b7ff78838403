"""``SearchSettings``: how the planner searches, one frozen value passed whole to plan, what-if and validate.

Change one with ``dataclasses.replace(settings, max_stages=8)``; every field is checked when the value is made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from cost_models.errors import InputError

__all__ = ["OPTIMIZERS", "SCHEDULES", "SOLVERS", "OptimizerName", "Progress", "ScheduleChoice", "SearchSettings",
           "SolverName"]

ScheduleChoice = Literal["auto", "sync", "stale"]
"""The pipeline schedules a search tries: ``sync``, ``stale``, or both (``auto``)."""
SolverName = Literal["cbc", "highs"]
"""The ILP solvers a search may ask for."""
OptimizerName = Literal["sgd", "momentum", "adam"]
"""The optimizers whose state the memory model counts."""

SCHEDULES: tuple[ScheduleChoice, ...] = ("sync", "stale", "auto")
SOLVERS: tuple[SolverName, ...] = ("cbc", "highs")
OPTIMIZERS: tuple[OptimizerName, ...] = ("sgd", "momentum", "adam")

Progress = Callable[[int, int], None]
"""``(done, total)``: how far a search or sweep has come (a progress bar's callback; nothing else)."""


@dataclass(frozen=True)
class SearchSettings:
    """The search's options (each field's docstring says what it sets)."""

    max_stages: int = 16
    """Most pipeline stages tried (1: one stage only)."""
    schedule: ScheduleChoice = "auto"
    """``sync`` (GPipe/1F1B micro-batches), ``stale`` (DSP) or ``auto`` (the faster)."""
    max_staleness: int | None = None
    """Cap on a stage's staleness (0: synchronous only; ``None``: DSP's ``2(K−1−k)``)."""
    solver: SolverName = "cbc"
    """The ILP solver (``cbc`` or ``highs``), where the exact search needs one."""
    time_limit_s: float | None = None
    """The ILP's time limit (``None``: none)."""
    optimizer: OptimizerName = "sgd"
    """Whose state the memory counts (``sgd``, ``momentum``, ``adam``)."""

    def __post_init__(self) -> None:
        checked: tuple[tuple[str, str, tuple[str, ...]], ...] = (
            ("schedule", self.schedule, SCHEDULES), ("solver", self.solver, SOLVERS),
            ("optimizer", self.optimizer, OPTIMIZERS))
        for name, value, known in checked:
            if value not in known:
                raise InputError(f"SearchSettings.{name} {value!r} is not one of {', '.join(known)}")
        if not isinstance(self.max_stages, int) or self.max_stages < 1:
            raise InputError(f"SearchSettings.max_stages must be an integer >= 1, got {self.max_stages!r}")
        if self.max_staleness is not None and (not isinstance(self.max_staleness, int) or self.max_staleness < 0):
            raise InputError(f"SearchSettings.max_staleness must be None or an integer >= 0, "
                             f"got {self.max_staleness!r}")
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise InputError(f"SearchSettings.time_limit_s must be None or > 0, got {self.time_limit_s!r}")

    def __str__(self) -> str:
        staleness = "" if self.max_staleness is None else f", staleness ≤ {self.max_staleness}"
        return f"≤ {self.max_stages} stages, {self.schedule}{staleness}, {self.solver}, {self.optimizer}"
