"""The input of the exact solvers: per layer a list of options with costs, per edge a cost matrix.

A :class:`CostTable` is pure data — no torch, no graph library needed — so
solvers are tested on hand-made tables and run in milliseconds. Option ``i``
of layer ``l`` costs ``node_s[l][i]`` seconds and ``memory_bytes[l][i]`` bytes
per rank; choosing options ``i`` for ``u`` and ``j`` for ``v`` on edge
``(u, v)`` adds ``edge_s[(u, v)][i][j]`` seconds (redistribution).
A :class:`Solution` is one option index per layer with its objective.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["CostTable", "Solution"]


@dataclass(frozen=True)
class CostTable:
    """Options and costs of every layer and edge, layers in topological order."""

    layers: tuple[str, ...]
    options: Mapping[str, tuple[str, ...]]
    node_s: Mapping[str, tuple[float, ...]]
    edge_s: Mapping[tuple[str, str], tuple[tuple[float, ...], ...]] = field(default_factory=dict)
    memory_bytes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    memory_limit_bytes: int | None = None

    def __post_init__(self) -> None:
        for layer in self.layers:
            if not self.options.get(layer):
                raise ValueError(f"layer {layer!r} has no options")
            if len(self.node_s[layer]) != len(self.options[layer]):
                raise ValueError(f"layer {layer!r}: {len(self.options[layer])} options but "
                                 f"{len(self.node_s[layer])} costs")
        position = {layer: index for index, layer in enumerate(self.layers)}
        for (u, v), matrix in self.edge_s.items():
            if position[u] >= position[v]:
                raise ValueError(f"edge ({u!r}, {v!r}) goes against the layer order")
            if len(matrix) != len(self.options[u]) or any(len(row) != len(self.options[v]) for row in matrix):
                raise ValueError(f"edge ({u!r}, {v!r}) needs a {len(self.options[u])}×{len(self.options[v])} matrix")

    @property
    def edges(self) -> tuple[tuple[str, str], ...]:
        """The edges with a cost matrix, in a stable order."""
        return tuple(sorted(self.edge_s, key=lambda e: (self.layers.index(e[0]), self.layers.index(e[1]))))

    def is_chain(self) -> bool:
        """Whether the edges are exactly ``layers[i] → layers[i+1]``."""
        return set(self.edge_s) == {(a, b) for a, b in zip(self.layers, self.layers[1:])}

    def objective(self, choice: Mapping[str, int]) -> float:
        """Total seconds of one option index per layer."""
        total = sum(self.node_s[layer][choice[layer]] for layer in self.layers)
        return total + sum(matrix[choice[u]][choice[v]] for (u, v), matrix in self.edge_s.items())

    def memory(self, choice: Mapping[str, int]) -> int:
        """Bytes per rank of a choice (0 when the table has no memory column)."""
        return sum(self.memory_bytes[layer][choice[layer]] for layer in self.layers if layer in self.memory_bytes)

    def fits(self, choice: Mapping[str, int]) -> bool:
        """Whether a choice respects the memory limit."""
        return self.memory_limit_bytes is None or self.memory(choice) <= self.memory_limit_bytes


@dataclass(frozen=True)
class Solution:
    """One option index per layer, its objective, and how it was found."""

    choice: Mapping[str, int]
    objective_s: float
    solver: str
    status: str
    seconds: float
    gap: float | None = 0.0

    def labels(self, table: CostTable) -> dict[str, str]:
        """The chosen option's label per layer."""
        return {layer: table.options[layer][index] for layer, index in self.choice.items()}

