"""``SearchSettings``: how the planner searches, one frozen value passed whole to plan, what-if and validate.

Change one with ``dataclasses.replace(settings, max_stages=8)``; every field is checked when the value is made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cost_models.errors import InputError

__all__ = ["OPTIMIZERS", "Progress", "SCHEDULES", "SOLVERS", "SearchSettings"]

SCHEDULES = ("sync", "stale", "auto")
SOLVERS = ("cbc", "highs")
OPTIMIZERS = ("sgd", "momentum", "adam")

Progress = Callable[[int, int], None]
"""``(done, total)``: how far a search or sweep has come (a progress bar's callback; nothing else)."""


@dataclass(frozen=True)
class SearchSettings:
    """The search's options.

    Attributes:
        max_stages: Most pipeline stages tried (1: one stage only).
        schedule: ``sync`` (GPipe/1F1B micro-batches), ``stale`` (DSP) or ``auto`` (the faster).
        max_staleness: Cap on a stage's staleness (0: synchronous only; ``None``: DSP's ``2(K−1−k)``).
        solver: The ILP solver (``cbc`` or ``highs``), where the exact search needs one.
        time_limit_s: The ILP's time limit (``None``: none).
        optimizer: Whose state the memory counts (``sgd``, ``momentum``, ``adam``).
    """

    max_stages: int = 16
    schedule: str = "auto"
    max_staleness: int | None = None
    solver: str = "cbc"
    time_limit_s: float | None = None
    optimizer: str = "sgd"

    def __post_init__(self) -> None:
        for name, value, known in (("schedule", self.schedule, SCHEDULES), ("solver", self.solver, SOLVERS),
                                   ("optimizer", self.optimizer, OPTIMIZERS)):
            if value not in known:
                raise InputError(f"SearchSettings.{name} {value!r} is not one of {', '.join(known)}")
        if not isinstance(self.max_stages, int) or self.max_stages < 1:
            raise InputError(f"SearchSettings.max_stages must be an integer >= 1, got {self.max_stages!r}")
        if self.max_staleness is not None and (not isinstance(self.max_staleness, int) or self.max_staleness < 0):
            raise InputError(f"SearchSettings.max_staleness must be None or an integer >= 0, got {self.max_staleness!r}")
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise InputError(f"SearchSettings.time_limit_s must be None or > 0, got {self.time_limit_s!r}")

    def __str__(self) -> str:
        staleness = "" if self.max_staleness is None else f", staleness ≤ {self.max_staleness}"
        return f"≤ {self.max_stages} stages, {self.schedule}{staleness}, {self.solver}, {self.optimizer}"
