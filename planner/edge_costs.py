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
  (``comm_cost.redistribution_row_s``);
* a channels-last linear reader split by filters adds its form's seconds
  (``cost_models.dense_forms``): the column form's per reader layout, or,
  where the producer holds the reader's own layout, the row form's instead
  of any move.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np

from cost_models.cluster import Cluster
from cost_models.comm_cost import (
    PATTERN_CASES,
    move_pattern_arrays,
    nested_mask,
    patterned_s,
    redistribution_row_s,
    sendrecv_coefficients,
)
from cost_models.dense_forms import channels_last_linear, column_form_s, form_s, row_form, row_form_s
from cost_models.edges import edge_frame, projected, reader_layout
from cost_models.ir.graph import dtype_itemsize
from cost_models.ir.kinds import DENSE_KINDS
from cost_models.ir.layer import Layer
from cost_models.layout import Layout, as_volume
from cost_models.profile import Profile

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["EdgeCosts", "PatternTable", "has_volumes"]


def has_volumes(graph: LayerGraph) -> bool:
    """Whether a layer of ``graph`` makes a volume (5-D), whose layouts split depth too."""
    return any(shape and not isinstance(shape[0], list) and len(shape) == 5
               for shape in (data.output_shape for _, data in graph.nodes(data=True)))


class PatternTable:
    """Move patterns between layouts whose rank count divides ``devices`` (splitting depth too with
    ``depth``), examined once per pair.

    Shared by every graph and batch size planned on the same devices of the
    same cluster (patterns do not depend on the tensor). Layouts get a slot
    when first seen (a search meets a few hundred of the thousands that divide
    16,384 devices), and the tables are dense over the slots, grown as needed.
    """

    def __init__(self, cluster: Cluster, devices: int, *, depth: bool = False) -> None:
        self.cluster, self.devices, self.depth = cluster, devices, depth
        self.layouts: list[Layout] = []
        self.index: dict[Layout, int] = {}
        self.parts = np.zeros((0, 5), dtype=np.int64)
        self.pattern_parts = np.full((0, 0), -1, dtype=np.int64)  # -1: not examined yet
        self.pattern_cases = np.zeros((len(PATTERN_CASES), 0, 0), dtype=bool)

    def slot(self, layout: Layout) -> int:
        """The slot of ``layout``, given one when first seen.

        Raises:
            ValueError: Its rank count does not divide the devices, or it splits depth in a table of images.
        """
        found = self.index.get(layout)
        if found is None:
            if self.devices % layout.ranks or (layout.d > 1 and not self.depth):
                raise ValueError(f"layout {layout} is not one of {self.devices} devices"
                                 f"{'' if self.depth else ' of images'}; hint: price it on a table of its devices")
            found = self.index[layout] = len(self.layouts)
            self.layouts.append(layout)
            self.parts = np.concatenate([self.parts, np.array([layout.parts()], dtype=np.int64)])
        return found

    def examine(self, starts: np.ndarray, ends: np.ndarray, patterned: np.ndarray) -> None:
        """Fill the tables for the nested pairs not examined yet, one start layout at a time."""
        self.pattern_parts = grown(self.pattern_parts, len(self.layouts), -1)
        self.pattern_cases = grown(self.pattern_cases, len(self.layouts), False)
        missing = patterned & (self.pattern_parts[starts][:, ends] < 0)
        for row in np.nonzero(missing.any(axis=1))[0]:
            start = starts[row]
            targets = ends[missing[row]]
            parts, present = move_pattern_arrays(self.cluster, self.layouts[start],
                                                 [self.layouts[end] for end in targets], self.devices)
            self.pattern_parts[start, targets] = parts
            self.pattern_cases[:, start, targets] = present


def grown(table: np.ndarray, size: int, fill: float) -> np.ndarray:
    """``table`` (square in its last two axes) with at least ``size`` rows and columns, new entries ``fill``
    (capacity doubles, so a table grown one slot at a time is copied a logarithmic number of times)."""
    have = table.shape[-1]
    if have >= size:
        return table
    bigger = np.full(table.shape[:-2] + (max(size, 2 * have, 64),) * 2, fill, dtype=table.dtype)
    bigger[..., :have, :have] = table
    return bigger


_MatrixKey = tuple[bool, str, str | bool, str | None, tuple[Layout, ...], tuple[Layout, ...]]
"""An edge matrix's key: from the model input, the tensor's shape key, how the reader reads it (``attention``, or
whether it is dense), its channels-last linear form's shape key (else ``None``), the layouts both sides."""


class EdgeCosts:
    """Edge cost matrices of one graph on ``devices`` ranks of ``cluster``, cached by tensor shape and layouts.

    With the patterns of a :class:`PatternTable`, a matrix is priced with
    array arithmetic over all its pairs at once.
    """

    def __init__(self, graph: LayerGraph, profile: Profile, cluster: Cluster, devices: int, itemsize: int,
                 patterns: PatternTable | None = None) -> None:
        self.graph, self.profile, self.cluster, self.devices, self.itemsize = graph, profile, cluster, devices, itemsize
        self.coefficients: dict[int, dict[bool, tuple[float, float]]] = {}  # per activation itemsize, when asked
        volumes = has_volumes(graph)
        self.table = patterns or PatternTable(cluster, devices, depth=volumes)
        if (self.table.cluster, self.table.devices) != (cluster, devices) or (volumes and not self.table.depth):
            raise ValueError(f"a pattern table for {self.table.devices} devices"
                             f"{'' if self.table.depth else ' of images'} cannot price moves of this graph on "
                             f"{devices}")
        self.matrices: dict[_MatrixKey, np.ndarray] = {}
        # per tensor shape, itemsize: seconds between layouts
        self.moves: dict[tuple[tuple[int, ...], int], np.ndarray] = {}
        self.sizes = {name: dtype_itemsize(data.dtype) if data.dtype else itemsize  # mixed precision
                      for name, data in graph.nodes(data=True)}
        self.shape_key = {name: json.dumps([data.output_shape, data.attrs.get("order"),
                                            self.sizes[name]]) for name, data in graph.nodes(data=True)}

    def matrix(self, source: str, target: str, haves: tuple[Layout, ...], layouts: tuple[Layout, ...]) -> np.ndarray:
        """Seconds for each pair of ``haves`` (rows, the producer's layouts) and ``layouts`` (the reader's)."""
        src, dst = self.graph.nodes[source], self.graph.nodes[target]
        reads = "attention" if dst.kind == "attention" else dst.kind in DENSE_KINDS  # (edges.reader_layout)
        formed = self.shape_key[target] if channels_last_linear(dst) else None  # (its forms' seconds)
        key = (src.kind == "input", self.shape_key[source], reads, formed, haves, layouts)
        if key not in self.matrices:
            moved = self._matrix(src, dst, haves, layouts, self.sizes[source])
            if formed is not None and src.kind != "input":
                rows, added = self._forms(src, dst, haves, layouts, self.sizes[source])
                moved = np.where(rows, 0.0, moved) + added
            self.matrices[key] = moved
        return self.matrices[key]

    def pairs(self, source: str, target: str, haves: tuple[Layout, ...], layouts: tuple[Layout, ...]) -> np.ndarray:
        """Seconds for each pair ``(haves[i], layouts[i])``: the diagonal of :meth:`matrix`, pricing only it (a
        uniform plan's edges need the moves between equal layouts, not between every two)."""
        slots = self._slots(self.graph.nodes[source], self.graph.nodes[target], haves, layouts)
        if slots is None:  # the model input is loaded in place
            return np.zeros(len(haves))
        shape, held, wanted = slots
        starts, rows = np.unique(held, return_inverse=True)
        ends, columns = np.unique(wanted, return_inverse=True)
        needed = np.zeros((len(starts), len(ends)), dtype=bool)
        needed[rows, columns] = True
        itemsize = self.sizes[source]
        forward = self._moves_s(shape, itemsize, starts, ends, needed)
        backward = self._moves_s(shape, itemsize, ends, starts, needed.T)
        moved = np.where(held == wanted, 0.0, forward[rows, columns] + backward[columns, rows])
        src, dst = self.graph.nodes[source], self.graph.nodes[target]
        if not channels_last_linear(dst) or src.kind == "input":
            return moved
        return np.array([(0.0 if row_form(src, dst, have, layout) else seconds)
                         + form_s(src, dst, have, layout, self.profile, self.cluster, itemsize)
                         for seconds, have, layout in zip(moved, haves, layouts)])

    def _forms(self, src: Layer, dst: Layer, haves: tuple[Layout, ...],
               layouts: tuple[Layout, ...], itemsize: int) -> tuple[np.ndarray, np.ndarray]:
        """For a channels-last linear reader (``cost_models.dense_forms``): which pairs of ``haves`` (rows) and
        ``layouts`` it reads in its row form (no move), and the seconds of its form for each pair."""
        profile, cluster = self.profile, self.cluster
        column = [column_form_s(dst, layout, profile, cluster, itemsize) for layout in layouts]
        rows = np.array([[row_form(src, dst, have, layout) for layout in layouts] for have in haves], dtype=bool)
        added = np.array([[row_form_s(dst, layout, profile, cluster, itemsize) if rows[i, j] else column[j]
                           for j, layout in enumerate(layouts)] for i in range(len(haves))])
        return rows, added.reshape(len(haves), len(layouts))

    def _slots(self, src: Layer, dst: Layer, haves: tuple[Layout, ...],
               layouts: tuple[Layout, ...]) -> tuple[tuple[int, ...], np.ndarray, np.ndarray] | None:
        """The moved tensor's shape and the table slots of what each of ``haves`` holds and each of ``layouts``
        wants (each projects alone: the held part does not depend on the reader's layout, nor the wanted one on
        the producer's); ``None`` for an edge free by rule (``cost_models.edges.edge_frame``)."""
        frame = edge_frame(src)
        if frame is None:
            return None
        shape, flat = frame
        slot, kind = self.table.slot, dst.kind
        held = np.array([slot(projected(have, flat)) for have in haves])
        wanted = np.array([slot(projected(reader_layout(kind, layout), flat)) for layout in layouts])
        return shape, held, wanted

    def _matrix(self, src: Layer, dst: Layer, haves: tuple[Layout, ...],
                layouts: tuple[Layout, ...], itemsize: int) -> np.ndarray:
        slots = self._slots(src, dst, haves, layouts)
        if slots is None:  # the model input is loaded in place
            return np.zeros((len(haves), len(layouts)))
        shape, held, wanted = slots
        starts, rows = np.unique(held, return_inverse=True)
        ends, columns = np.unique(wanted, return_inverse=True)
        forward = self._moves_s(shape, itemsize, starts, ends)
        backward = self._moves_s(shape, itemsize, ends, starts)
        seconds = forward[rows][:, columns] + backward[columns][:, rows].T
        return np.where(held[:, None] == wanted[None, :], 0.0, seconds)

    def _moves_s(self, shape: tuple[int, ...], itemsize: int, starts: np.ndarray, ends: np.ndarray,
                 needed: np.ndarray | None = None) -> np.ndarray:
        """Seconds of the busiest rank moving a ``shape`` tensor of ``itemsize``-byte elements from each of
        ``starts`` to each of ``ends`` (only where ``needed``, if given: NaN elsewhere, unless priced before).

        Each move is priced once per tensor shape (kept in a dense table over the table's slots, NaN until priced).
        """
        known = self.moves[shape, itemsize] = grown(self.moves.get((shape, itemsize), np.zeros((0, 0))),
                                                    len(self.table.layouts), np.nan)
        block = np.ix_(starts, ends)
        seconds = known[block]
        missing = np.isnan(seconds) if needed is None else np.isnan(seconds) & needed
        if missing.any():
            seconds = np.where(missing, self._priced_moves_s(shape, itemsize, starts, ends, missing), seconds)
            known[block] = seconds
        return seconds

    def _priced_moves_s(self, shape: tuple[int, ...], itemsize: int, starts: np.ndarray, ends: np.ndarray,
                        wanted: np.ndarray) -> np.ndarray:
        """The moves of :meth:`_moves_s`, priced where ``wanted`` (elsewhere: any value)."""
        if self.devices == 1:  # one device moves nothing (and a one-rank profile has no link to price it)
            return np.zeros((len(starts), len(ends)))
        extents = np.array(as_volume(shape), dtype=np.int64)
        source, target = self.table.parts[starts][:, None, :], self.table.parts[ends][None, :, :]
        patterned = nested_mask(extents, source, target)
        self.table.examine(starts, ends, patterned & wanted)
        table = self.table
        if itemsize not in self.coefficients:
            self.coefficients[itemsize] = sendrecv_coefficients(self.profile, itemsize)
        seconds = patterned_s(self.coefficients[itemsize], table.pattern_parts[starts][:, ends],
                              table.pattern_cases[:, starts][:, :, ends], extents, source, target)
        for row, column in zip(*np.nonzero(~patterned & wanted)):  # rank by rank: splits that do not nest or divide
            seconds[row, column] = redistribution_row_s(self.profile, self.cluster, shape, itemsize,
                                                        self.table.layouts[starts[row]],
                                                        [self.table.layouts[ends[column]]],
                                                        self.devices)[0]
        return seconds
