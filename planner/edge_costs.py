"""Redistribution seconds between every pair of candidate layouts of an edge, as matrices.

The value of each entry is ``cost_models.estimate.edge_s`` (forward move of
the activation plus backward move of its gradient); this module only
computes many at once:

* both layouts of a pair project independently (a 2-D tensor keeps ``n`` and
  ``c``; a filter-split reader wants ``c = 1``), so a matrix needs the moves
  between the distinct projected layouts only;
* between nested layouts that divide the tensor, a move's busiest rank
  follows from a shape-independent :class:`~cost_models.comm_cost.MovePattern`,
  found once per pair of layouts by examining every rank, then priced per
  tensor shape with array arithmetic; other pairs are computed rank by rank
  (``comm_cost.redistribution_row_s``).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np

from cost_models.cluster import Cluster
from cost_models.comm_cost import MovePattern, move_patterns, nested, redistribution_row_s, sendrecv_coefficients
from cost_models.estimate import edge_layouts
from cost_models.layout import Layout
from cost_models.local_problem import DENSE_KINDS
from cost_models.profile import Profile

__all__ = ["EdgeCosts"]

_CASES = ((False, False), (False, True), (True, False), (True, True))  # (holds own part, spans nodes)


class EdgeCosts:
    """Edge cost matrices of one graph on ``devices`` ranks of ``cluster``, cached by tensor shape and layouts."""

    def __init__(self, graph: Any, profile: Profile, cluster: Cluster, devices: int, itemsize: int) -> None:
        self.graph, self.profile, self.cluster, self.devices, self.itemsize = graph, profile, cluster, devices, itemsize
        self.coefficients = sendrecv_coefficients(profile, itemsize)
        self.patterns: dict[tuple[Layout, Layout], MovePattern] = {}
        self.matrices: dict[tuple[Any, ...], np.ndarray] = {}
        self.shape_key = {name: json.dumps(data["output_shape"]) for name, data in graph.nodes(data=True)}

    def matrix(self, source: str, target: str, haves: tuple[Layout, ...], layouts: tuple[Layout, ...]) -> np.ndarray:
        """Seconds for each pair of ``haves`` (rows, the producer's layouts) and ``layouts`` (the reader's)."""
        src, dst = self.graph.nodes[source], self.graph.nodes[target]
        key = (src["kind"] == "input", self.shape_key[source], dst["kind"] in DENSE_KINDS, haves, layouts)
        if key not in self.matrices:
            self.matrices[key] = self._matrix(src, dst, haves, layouts)
        return self.matrices[key]

    def _matrix(self, src: Mapping[str, Any], dst: Mapping[str, Any], haves: tuple[Layout, ...],
                layouts: tuple[Layout, ...]) -> np.ndarray:
        first = edge_layouts(src, dst, haves[0], layouts[0])
        if first is None:  # the model input is loaded in place
            return np.zeros((len(haves), len(layouts)))
        shape = first[0]
        projected_haves = [edge_layouts(src, dst, have, layouts[0])[1] for have in haves]  # type: ignore[index]
        projected_wants = [edge_layouts(src, dst, haves[0], layout)[2] for layout in layouts]  # type: ignore[index]
        starts, ends = list(dict.fromkeys(projected_haves)), list(dict.fromkeys(projected_wants))
        forward = np.array([self._row(shape, start, ends) for start in starts])
        backward = np.array([self._row(shape, end, starts) for end in ends])
        rows = np.array([starts.index(layout) for layout in projected_haves])
        columns = np.array([ends.index(layout) for layout in projected_wants])
        seconds = forward[rows][:, columns] + backward[columns][:, rows].T
        same = np.array([[have == want for want in projected_wants] for have in projected_haves])
        return np.where(same, 0.0, seconds)

    def _row(self, shape: tuple[int, ...], start: Layout, ends: Sequence[Layout]) -> np.ndarray:
        """Seconds of the busiest rank moving a ``shape`` tensor from ``start`` to each of ``ends``."""
        seconds = np.zeros(len(ends))
        patterned = [index for index, end in enumerate(ends) if nested(start, end, shape)]
        rest = [index for index in range(len(ends)) if index not in set(patterned)]
        if patterned:
            seconds[patterned] = self._patterned_s(shape, start, [ends[index] for index in patterned])
        if rest:
            seconds[rest] = redistribution_row_s(self.profile, self.cluster, shape, self.itemsize, start,
                                                 [ends[index] for index in rest], self.devices)
        return seconds

    def _patterned_s(self, shape: tuple[int, ...], start: Layout, ends: list[Layout]) -> np.ndarray:
        missing = [end for end in ends if (start, end) not in self.patterns]
        if missing:
            self.patterns.update(zip(((start, end) for end in missing),
                                     move_patterns(self.cluster, start, missing, self.devices)))
        patterns = [self.patterns[(start, end)] for end in ends]
        extents = np.array(shape, dtype=np.int64)
        end_parts = np.array([end.parts() for end in ends], dtype=np.int64)
        wanted = (extents // end_parts).prod(axis=1).astype(np.float64)
        own = (extents // np.maximum(end_parts, np.array(start.parts()))).prod(axis=1).astype(np.float64)
        parts = np.array([pattern.parts for pattern in patterns], dtype=np.float64)
        worst = np.zeros(len(ends))
        for holds, spans in _CASES:
            present = np.array([(holds, spans) in pattern.cases for pattern in patterns]) & (parts - holds > 0)
            alpha_s, beta_s = self.coefficients[spans]
            cost = alpha_s * (parts - holds) + beta_s * (wanted - own * holds)
            worst = np.where(present, np.maximum(worst, cost), worst)
        return worst
