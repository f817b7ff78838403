"""The test oracle: try every combination of options (tiny tables only)."""

from __future__ import annotations

import itertools
import time
from math import prod

from planner.solvers.cost_table import CostTable, Solution

__all__ = ["MAX_COMBINATIONS", "solve_brute_force"]

MAX_COMBINATIONS = 200_000


def solve_brute_force(table: CostTable) -> Solution:
    """The cheapest choice that fits in memory, by enumeration.

    Raises:
        ValueError: More than ``MAX_COMBINATIONS`` combinations, or none fits.
    """
    combinations = prod(len(table.options[layer]) for layer in table.layers)
    if combinations > MAX_COMBINATIONS:
        raise ValueError(f"{combinations} combinations is too many to enumerate (limit {MAX_COMBINATIONS})")
    started = time.perf_counter()
    best: tuple[float, dict[str, int]] | None = None
    for indices in itertools.product(*(range(len(table.options[layer])) for layer in table.layers)):
        choice = dict(zip(table.layers, indices))
        if not table.fits(choice):
            continue
        objective = table.objective(choice)
        if best is None or objective < best[0]:
            best = (objective, choice)
    if best is None:
        raise ValueError("no combination fits in the memory limit")
    return Solution(best[1], best[0], "brute-force", "Optimal", time.perf_counter() - started)
