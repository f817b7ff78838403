"""The search space: which layouts each layer may take on a stage's devices, and their cost tables.

Candidates (the seed paper's formulation, Dryden et al. 2019: every layer is
split over all the processors of its stage; enumerated in ``planner.layout_space``):
    * ``Layout(n, c, h, w)`` with ``n·c·h·w`` equal to the stage's devices and
      each split dividing its extent of the layer's output exactly; a layer
      that has no such layout (too small to use every device) may take the
      layouts with fewer ranks that divide it, the other ranks holding copies.
    * Channel/filter groups stay inside a node: ``c ≤ devices per node`` (as
      tensor parallelism does in Megatron-LM: its allgather of the input and
      sum of input gradients per layer need the fast link).
    * Spatial tiles ``h × w`` are rows only, columns only, or the most nearly
      square grid (``h ≥ w``): 1-D strips have the fewest halo messages (two
      neighbours, no corners), square tiles the fewest halo bytes; grids in
      between have as many messages as square ones and more bytes.
    * The kind must support the split and every tile must be at least as wide
      as its halo (``cost_models.local_problem``, ``cost_models.halo``), and
      every input must be readable in the layout the layer wants it in (each
      rank's part non-empty, an extent of 1 held whole:
      ``cost_models.redistribution.holdable``) — a layout one layer cannot
      take leaves that layer's options, it never aborts the plan.
    * Followers: a batch-norm, activation, dropout or identity layer whose one
      input is another layer takes that layer's layout (as Alpa merges
      element-wise operators into their operand); so does an element-wise
      layer with several inputs (add, mul), following the first input of its
      own output's shape — not a broadcast operand such as a squeeze-excitation
      scale — unless that would make decisions depend on each other in a
      circle (:func:`decision_groups`). The layer and its followers are one
      decision: one row of the cost table, named after the first.

Costs come from ``cost_models``: per decision and layout the seconds and
resident bytes per rank of all its layers; per edge between decisions and
pair of layouts the redistribution seconds forward and backward. The
weight-gradient allreduce overlaps backward in the full model, which an
additive objective cannot say, so there are two tables that bracket it:
``table`` counts each allreduce in full, ``hidden_allreduce`` not at all.

Before any edge matrix is built, options that no optimal plan of either
table can use are pruned (``planner.solvers.prune``) with an upper bound from the
best plan among a restricted set: the uniform layouts and, per decision, the
few cheapest options, solved exactly.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

import networkx as nx
import numpy as np

from cost_models.capability.predicate import layer_refusal
from cost_models.cluster import Cluster
from cost_models.edges import edge_free, edge_layouts
from cost_models.errors import InputError
from cost_models.estimate import CostMemo
from cost_models.ir.graph import dtype_itemsize
from cost_models.ir.layer import Layer
from cost_models.layout import Layout
from cost_models.profile import Profile
from cost_models.redistribution import holdable
from cost_models.uniform import NO_COMPUTE_KINDS, fits_output
from planner.edge_costs import EdgeCosts, PatternTable
from planner.layout_space import layout_tiers
from planner.solvers.cost_table import CostTable
from planner.solvers.exact import solve_exact
from planner.solvers.prune import surviving_options

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["FOLLOWER_KINDS", "Arrivals", "DecisionRow", "LayerCosts", "Space", "build_space", "decision_groups"]

FOLLOWER_KINDS = frozenset({"batchnorm", "activation", "dropout", "identity"})
MERGED_KINDS = frozenset({"add", "mul", "elementwise"})  # element-wise with several inputs: follow the leading one
_RESTRICTED_PER_DECISION = 3  # cheapest options per decision in the restricted solve that sets the upper bound


@dataclass(frozen=True)
class Space:
    """Candidate layouts per decision, the layers each decision places, and the two cost tables."""

    candidates: Mapping[str, tuple[Layout, ...]]
    members: Mapping[str, tuple[str, ...]]
    table: CostTable
    hidden_allreduce: CostTable
    considered: int
    pruned: int
    uniform_s: Mapping[Layout, float]
    uniform_layouts: Mapping[Layout, Mapping[str, Layout]]

    def layouts(self, choice: Mapping[str, int]) -> dict[str, Layout]:
        """Every layer's layout from one option index per decision."""
        return {layer: self.candidates[head][index] for head, index in choice.items() for layer in self.members[head]}

    def choice_of(self, layouts: Mapping[str, Layout]) -> dict[str, int] | None:
        """The option indices of a per-layer layout assignment, or ``None`` when it is not in the space."""
        choice: dict[str, int] = {}
        for head, members in self.members.items():
            layout = layouts[head]
            if layout not in self.candidates[head] or any(layouts[m] != layout for m in members):
                return None
            choice[head] = self.candidates[head].index(layout)
        return choice


def decision_groups(graph: LayerGraph) -> dict[str, tuple[str, ...]]:
    """Per decision (named by its first layer, in topological order) the layers that share its layout.

    Built in one pass over the layers in execution order, keeping the graph of
    decisions (an edge wherever a layer of one feeds a layer of another)
    acyclic at every step: a follower with one input adds no edge between
    decisions, a new decision only edges into itself, and an element-wise
    layer with several inputs follows its leading input (the first of its own
    output's shape, else the first) only if none of its other inputs'
    decisions is reachable from that one's (else it would close a circle: its
    other input computed from its leading one); then it is a decision of its
    own. Every layer of a decision descends from its first.
    """
    layers = graph.compute_layers()
    compute = set(layers)
    head_of: dict[str, str] = {}
    groups: dict[str, list[str]] = {}
    contracted = nx.DiGraph()
    for name in layers:
        inputs = [source for source in graph.predecessors(name) if source in compute]  # argument order
        head = _joined_head(graph, name, inputs, head_of, contracted)
        head_of[name] = head
        groups.setdefault(head, []).append(name)
        contracted.add_node(head)
        contracted.add_edges_from((head_of[source], head) for source in inputs if head_of[source] != head)
    position = {layer: index for index, layer in enumerate(layers)}
    order = nx.lexicographical_topological_sort(contracted, key=position.__getitem__)  # acyclic by construction
    return {head: tuple(groups[head]) for head in order}


def _joined_head(graph: LayerGraph, name: str, inputs: list[str], head_of: Mapping[str, str],
                 contracted: nx.DiGraph) -> str:
    """The decision ``name`` joins: its leading input's, or its own (module docstring, :func:`decision_groups`)."""
    kind, arguments = graph.nodes[name].kind, list(graph.predecessors(name))
    lead = _leading_input(graph, name, arguments)
    if lead not in inputs:  # a placeholder (or no input at all)
        return name
    first = head_of[lead]
    if kind in FOLLOWER_KINDS and len(arguments) == 1:
        return first
    if kind == "getitem" and len(arguments) == 1 and isinstance((graph.nodes[lead].output_shape or [0])[0], list):
        return first  # an item of a layer's several outputs: in that layer's layout (piece_layout_refusal)
    if kind == "getitem" and len(arguments) == 1 and graph.nodes[lead].kind == "attention":
        return first  # out of attention's (out, None): where the attention left it (runtime.apply)
    if kind not in MERGED_KINDS:
        return name
    others = {head_of[source] for source in inputs if source != lead} - {first}
    return name if any(nx.has_path(contracted, first, other) for other in others) else first


def _leading_input(graph: LayerGraph, name: str, arguments: list[str]) -> str | None:
    """The input a merged layer follows: the first of its own output's shape (not broadcast), else the first."""
    output = graph.nodes[name].output_shape
    return next((source for source in arguments if graph.nodes[source].output_shape == output),
                arguments[0] if arguments else None)


def build_space(graph: LayerGraph, profile: Profile, cluster: Cluster, devices: int, optimizer: str = "sgd",
                memory_limit_bytes: int | None = None, decisions: Sequence[str] | None = None,
                costs: LayerCosts | None = None, prune: bool = True, *, memo: CostMemo | None = None) -> Space:
    """Candidates and both cost tables of the decisions of ``graph`` on ``devices`` devices.

    Args:
        decisions: Only these decisions (a pipeline stage's); all by default.
        costs: A cost cache to share between stages of the same devices and batch.
        prune: Drop the options no optimal plan can use (``planner.solvers.prune``); off only to check that rule.
        memo: Layer costs to share with the estimates of the same search (without ``costs``).

    Raises:
        InputError: A layer has no layout at all on these devices.
    """
    costs = costs or LayerCosts(graph, profile, cluster, devices, optimizer, memo=memo)
    groups = dict(costs.groups) if costs.graph is graph else decision_groups(graph)
    if decisions is not None:
        groups = {head: groups[head] for head in decisions}
    rows = {head: costs.rows(members) for head, members in groups.items()}
    considered = sum(len(options) for options in rows.values())
    edges = _decision_edges(graph, groups)
    uniform = _uniform_objectives(rows, edges, costs, memory_limit_bytes)
    bounds = _upper_bounds(rows, edges, costs, memory_limit_bytes, uniform) if prune else (None, None)
    limit = memory_limit_bytes if prune else None
    kept = [surviving_options({h: [r.seconds(hidden) for r in opts] for h, opts in rows.items()},
                              {h: [r.memory_bytes for r in opts] for h, opts in rows.items()}, limit, bound)
            for hidden, bound in zip((False, True), bounds)]
    kept_rows = {head: [options[i] for i in sorted(set(kept[0][head]) | set(kept[1][head]))]
                 for head, options in rows.items()}
    for head, options in kept_rows.items():
        if not options:  # only the memory rule can empty a row: nothing fits
            kept_rows[head] = rows[head]
    full, hidden = _tables(kept_rows, edges, costs, memory_limit_bytes)
    candidates = {head: tuple(row.layout for row in options) for head, options in kept_rows.items()}
    return Space(candidates, groups, full, hidden, considered, considered - sum(map(len, candidates.values())),
                 {layout: objective.time_s for layout, objective in uniform.items()},
                 {layout: objective.layouts for layout, objective in uniform.items()})


class LayerCosts:
    """Per layer and layout: seconds (allreduce in full, and hidden) and resident bytes; per edge: seconds.

    Layers with the same shapes and hyper-parameters (repeated blocks) are
    costed once, and so are redistributions of the same tensor shape.
    ``saved_copies`` counts the micro-batches whose activations stay resident;
    ``recompute``: the stage keeps none but its inputs and runs each forward
    again before its backward — every layer's seconds add its forward, its
    bytes count one micro-batch's activations (``Pipeline.recompute``).
    :meth:`variant` gives the costs of the same layers under other counts,
    sharing what does not depend on them (layer costs, edge matrices).
    """

    def __init__(self, graph: LayerGraph, profile: Profile, cluster: Cluster, devices: int, optimizer: str,
                 saved_copies: int = 1, patterns: PatternTable | None = None, *, memo: CostMemo | None = None,
                 recompute: bool = False, smallest: LayerGraph | None = None,
                 groups: Mapping[str, tuple[str, ...]] | None = None) -> None:
        """``smallest``: the graph on the smallest micro-batch, where micro-batches differ in size (``graph``:
        on the largest, which every one is priced as): a layout must split each layer on both. ``groups``:
        :func:`decision_groups` of ``graph``, where the caller has them."""
        if groups is not None:
            self.groups = dict(groups)  # (else the cached property finds them)
        self.arrivals: Arrivals | None = None  # asked before a decision's rows are made here
        self.smallest = smallest
        self.graph, self.profile, self.cluster = graph, profile, cluster
        self.devices, self.optimizer = devices, optimizer
        self.saved_copies = 1 if recompute else saved_copies
        self.recompute = recompute
        self.rows_seen: dict[tuple[str, ...], list[DecisionRow]] = {}
        self.dtype = graph.graph["dtype"]
        self.itemsize = dtype_itemsize(self.dtype)
        self.memo = memo or CostMemo(profile, self.dtype)  # shared with the estimates of the same search
        self.memo.check(profile, self.dtype)
        self.layer_seen: dict[tuple[str, Layout], tuple[float, float, int] | None] = {}
        self.raw_seen: dict[tuple[str, Layout], _Raw | None] = {}  # shared by the variants
        self.followed: dict[tuple[str, Layout], float] = {}  # follower edges, shared by the variants
        self.edges = EdgeCosts(graph, profile, cluster, devices, self.itemsize, patterns)
        self.signature = {name: self.memo.signature(data) for name, data in graph.nodes(data=True)}

    def variant(self, saved_copies: int, recompute: bool) -> LayerCosts:
        """These layers' costs holding ``saved_copies`` micro-batches' activations, or recomputing them."""
        other = copy.copy(self)
        other.saved_copies, other.recompute = (1 if recompute else saved_copies), recompute
        other.rows_seen, other.layer_seen = {}, {}
        return other

    @cached_property
    def groups(self) -> dict[str, tuple[str, ...]]:
        """:func:`decision_groups` of the graph (computed once)."""
        return decision_groups(self.graph)

    def layer(self, name: str, layout: Layout) -> tuple[float, float, int] | None:
        """``(seconds, seconds without allreduce, bytes)`` of ``name`` under ``layout``, or ``None`` if refused."""
        signature = self.signature[name]
        key = (signature, layout)
        if key not in self.layer_seen:
            if key not in self.raw_seen:
                self.raw_seen[key] = (self._raw(signature, self.graph.nodes[name], layout)
                                      if self._reads(name, layout) else None)
            raw = self.raw_seen[key]
            self.layer_seen[key] = None if raw is None else self._priced(raw)
        return self.layer_seen[key]

    def _priced(self, raw: _Raw) -> tuple[float, float, int]:
        total_s, allreduce_s, forward_s, resident_bytes, saved_bytes = raw
        again_s = forward_s if self.recompute else 0.0
        return (total_s + again_s, total_s - allreduce_s + again_s,
                resident_bytes + (self.saved_copies - 1) * saved_bytes)

    def _reads(self, name: str, layout: Layout) -> bool:
        """Whether ``name`` under ``layout`` can read each input as it wants it — no rank's part empty — and, on
        the smallest of uneven micro-batches, still splits (``cost_models.capability.predicate``)."""
        if self.smallest is not None and layer_refusal(self.smallest.nodes[name], layout) is not None:
            return False
        target = self.graph.nodes[name]
        for source in self.graph.predecessors(name):
            move = edge_layouts(self.graph.nodes[source], target, layout, layout)
            if move is not None and not holdable(move[0], move[2]):
                return False
        return True

    def _raw(self, signature: str, node: Layer, layout: Layout) -> _Raw | None:
        problem = self.memo.problem(signature, node, layout)
        if problem is None and not (node.kind in NO_COMPUTE_KINDS and fits_output(node, layout)):
            return None
        try:
            cost = self.memo.cost("", signature, node, layout, self.devices, self.cluster)
        except InputError:  # a halo wider than the neighbouring tile, or a split the kind refuses
            return None
        memory = self.memo.memory(signature, node, layout, self.optimizer)
        return cost.total_s, cost.allreduce_s, cost.forward_s, memory.resident_bytes, memory.saved

    def rows(self, members: tuple[str, ...]) -> list[DecisionRow]:
        """The options of the decision placing ``members``: layout, seconds, seconds with hidden allreduce, bytes."""
        if members not in self.rows_seen:
            found = None if self.arrivals is None else self.arrivals(self, members)
            self.rows_seen[members] = found if found is not None else _decision_rows(self.graph, self, members,
                                                                                     self.devices)
        return self.rows_seen[members]

    def follower_edge(self, name: str, layout: Layout) -> float:
        """:meth:`edge` from the first input of ``name`` (a follower) in ``layout`` to ``name`` in ``layout``."""
        key = (name, layout)
        if key not in self.followed:
            self.followed[key] = self.edge(next(iter(self.graph.predecessors(name))), name, layout, layout)
        return self.followed[key]

    def edge(self, source: str, target: str, have: Layout, layout: Layout) -> float:
        """Redistribution seconds (forward and backward) on the edge ``source → target``."""
        if edge_free(self.graph.nodes[source], self.graph.nodes[target], have, layout):
            return 0.0
        return float(self.edges.matrix(source, target, (have,), (layout,))[0, 0])


class DecisionRow(NamedTuple):
    """One priced option of one decision: its layout, seconds, seconds with the allreduce hidden, bytes per rank."""

    layout: Layout
    time_s: float
    """Seconds of the decision's layers (and its followers' edges), each weight-gradient allreduce in full."""
    hidden_s: float
    """The same seconds with the allreduce hidden (not counted at all)."""
    memory_bytes: int
    """Resident bytes per rank."""

    def seconds(self, hidden: bool) -> float:
        """:attr:`hidden_s` where ``hidden``, else :attr:`time_s` (the two tables of ``Space``)."""
        return self.hidden_s if hidden else self.time_s


Arrivals = Callable[[LayerCosts, tuple[str, ...]], "list[DecisionRow] | None"]
"""``arrivals(costs, members)``: the rows of that decision under those costs computed elsewhere —
:meth:`LayerCosts.rows` of equal costs in another process (``planner.ahead``) — or ``None``: then they are made
here."""
_Raw = tuple[float, float, float, int, int]  # seconds, allreduce, forward seconds, resident and saved bytes


class _Uniform(NamedTuple):
    """One layout used wherever it applies: seconds, seconds with the allreduce hidden, layout per decision."""

    time_s: float
    hidden_s: float
    layouts: dict[str, Layout]


def _decision_rows(graph: LayerGraph, costs: LayerCosts, members: tuple[str, ...],
                   devices: int) -> list[DecisionRow]:
    head = members[0]
    for layouts in layout_tiers(graph.nodes[head], devices, costs.cluster.devices_per_node):
        rows = [row for row in (_decision_row(graph, costs, members, layout) for layout in layouts) if row]
        if rows:
            return rows
    raise InputError(f"layer '{head}' ({graph.nodes[head].kind}, output {tuple(graph.nodes[head].output_shape)}) "
                     f"has no layout on {devices} devices; try a device count its extents can be split by")


def _decision_row(graph: LayerGraph, costs: LayerCosts, members: tuple[str, ...],
                  layout: Layout) -> DecisionRow | None:
    total_s = hidden_s = 0.0
    nbytes = 0
    for index, name in enumerate(members):
        found = costs.layer(name, layout)
        if found is None:
            return None
        total_s, hidden_s, nbytes = total_s + found[0], hidden_s + found[1], nbytes + found[2]
        if index:  # a follower reads its producer's output in the same layout
            moved = costs.follower_edge(name, layout)
            total_s, hidden_s = total_s + moved, hidden_s + moved
    return DecisionRow(layout, total_s, hidden_s, nbytes)


def _decision_edges(graph: LayerGraph,
                    groups: Mapping[str, tuple[str, ...]]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """Per pair of decisions, the graph edges between their layers."""
    head_of = {layer: head for head, members in groups.items() for layer in members}
    edges: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for u, v in graph.edges:
        if u in head_of and v in head_of and head_of[u] != head_of[v]:
            edges.setdefault((head_of[u], head_of[v]), []).append((u, v))
    return edges


def _uniform_objectives(rows: Mapping[str, list[DecisionRow]], edges: Mapping[tuple[str, str], list[tuple[str, str]]],
                        costs: LayerCosts, memory_limit_bytes: int | None) -> dict[Layout, _Uniform]:
    """Objectives (full, hidden allreduce) of each layout used wherever it applies, where it fits in memory.

    A decision that cannot take the layout (too small to split that way)
    takes its widest pure sample layout, or its fastest layout if it has none.
    """
    fallback = {head: min(options, key=lambda row: (row.layout.c * row.layout.h * row.layout.w > 1, -row.layout.n,
                                                    row.time_s))
                for head, options in rows.items()}
    uniform = [row.layout for row in next(iter(rows.values()))]
    placed = {head: {row.layout: row for row in options} for head, options in rows.items()}
    per_layout = [{head: placed[head].get(layout, fallback[head]) for head in rows} for layout in uniform]
    diagonal: dict[tuple[str, str], np.ndarray] = {}  # per pair of decisions, the seconds under each uniform layout
    for (a, b), links in edges.items():
        haves, wants = tuple(c[a].layout for c in per_layout), tuple(c[b].layout for c in per_layout)
        diagonal[(a, b)] = np.asarray(sum(costs.edges.pairs(u, v, haves, wants) for u, v in links))
    found = {}
    for position, (layout, chosen) in enumerate(zip(uniform, per_layout)):
        if memory_limit_bytes is not None and sum(row.memory_bytes for row in chosen.values()) > memory_limit_bytes:
            continue
        moved = float(sum(diagonal[(a, b)][position] for a, b in edges)) if edges else 0.0
        found[layout] = _Uniform(sum(row.time_s for row in chosen.values()) + moved,
                                 sum(row.hidden_s for row in chosen.values()) + moved,
                                 {head: row.layout for head, row in chosen.items()})
    return found


def _upper_bounds(rows: Mapping[str, list[DecisionRow]], edges: Mapping[tuple[str, str], list[tuple[str, str]]],
                  costs: LayerCosts, memory_limit_bytes: int | None,
                  uniform: Mapping[Layout, _Uniform]) -> tuple[float | None, float | None]:
    """Objectives (full, hidden allreduce) of the best plans found among uniform layouts and a restricted table."""
    restricted = {head: _restricted(options) for head, options in rows.items()}
    bounds: list[float | None] = []
    for hidden, table in zip((False, True), _tables(restricted, edges, costs, memory_limit_bytes)):
        known = [objective.hidden_s if hidden else objective.time_s for objective in uniform.values()]
        try:
            known.append(solve_exact(table).objective_s)
        except InputError:  # the restricted options do not fit in memory
            pass
        bounds.append(min(known, default=None))
    return bounds[0], bounds[1]


def _restricted(options: list[DecisionRow]) -> list[DecisionRow]:
    cheapest = sorted(options, key=lambda row: (row.time_s, row.layout))[:_RESTRICTED_PER_DECISION]
    leanest = min(options, key=lambda row: (row.memory_bytes, row.time_s))
    sample = max(options, key=lambda row: (row.layout.n, -row.layout.ranks))  # keeps a pure sample plan reachable
    return list(dict.fromkeys([*cheapest, leanest, sample]))


def _tables(rows: Mapping[str, list[DecisionRow]], edges: Mapping[tuple[str, str], list[tuple[str, str]]],
            costs: LayerCosts, memory_limit_bytes: int | None) -> tuple[CostTable, CostTable]:
    heads = tuple(rows)
    labels = {head: tuple(str(row.layout) for row in options) for head, options in rows.items()}
    memory = {head: tuple(row.memory_bytes for row in options) for head, options in rows.items()}
    matrices = {}
    for (head_u, head_v), links in edges.items():
        haves, layouts = tuple(row.layout for row in rows[head_u]), tuple(row.layout for row in rows[head_v])
        total = sum(costs.edges.matrix(u, v, haves, layouts) for u, v in links)
        matrices[(head_u, head_v)] = tuple(tuple(row) for row in np.asarray(total).tolist())
    full = CostTable(heads, labels, {h: tuple(r.time_s for r in o) for h, o in rows.items()}, matrices, memory,
                     memory_limit_bytes)
    hidden = CostTable(heads, labels, {h: tuple(r.hidden_s for r in o) for h, o in rows.items()}, matrices, memory,
                       memory_limit_bytes)
    return full, hidden
