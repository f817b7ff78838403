"""What estimates of one profile, dtype and thread count have computed: local problems, layer costs, memory and
edge seconds, per layer signature and layout (``cost_models.estimate``'s :class:`CostMemo`)."""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import replace
from functools import lru_cache

from cost_models.cluster import Cluster
from cost_models.comm_cost import redistribution_s
from cost_models.dense_forms import form_s
from cost_models.edges import edge_move
from cost_models.ir.graph import dtype_itemsize, layer_itemsize
from cost_models.ir.layer import Layer
from cost_models.layer_cost import Compute, LayerCost, compute_s, problem_cost
from cost_models.layout import Layout
from cost_models.local_problem import LocalProblem, layer_problem
from cost_models.memory import LayerMemory, layer_memory
from cost_models.profile import Profile

__all__ = ["CostMemo"]


class CostMemo:
    """Local problems, layer costs and edge seconds already computed for one profile, dtype and thread count.

    A layer is known by its :meth:`signature` (everything its traced node
    carries but the module it belongs to), so repeated blocks — and a layer
    met again in another plan or in the planner's search space — are costed
    once. Only results are kept: a layout that raises raises again. The
    signature of a node's data is remembered by identity, so the graphs
    priced must not change while the memo is in use.
    """

    def __init__(self, profile: Profile, dtype: str, threads: int | None = None) -> None:
        """``threads``: CPU threads per rank of the runs priced (kernels' workspace; ``None``: the profile's)."""
        self.profile, self.dtype, self.itemsize, self.threads = profile, dtype, dtype_itemsize(dtype), threads
        self.problems: dict[tuple[str, Layout], LocalProblem | None] = {}
        self.costs: dict[tuple[Hashable, ...], LayerCost] = {}
        self.memories: dict[tuple[str, Layout, str], LayerMemory] = {}
        self.computes: dict[LocalProblem, Compute] = {}
        self.edges: dict[tuple[Hashable, ...], float] = {}
        self.signatures: dict[int, tuple[Layer, str]] = {}  # by id: the node data (kept alive) and its text

    def renewed(self) -> CostMemo:
        """A memo sharing these results but no remembered signatures: for graphs that may have changed since."""
        memo = CostMemo(self.profile, self.dtype, self.threads)
        memo.problems, memo.costs, memo.memories, memo.edges = self.problems, self.costs, self.memories, self.edges
        memo.computes = self.computes
        return memo

    def size(self) -> int:
        """How many results it holds."""
        return len(self.problems) + len(self.costs) + len(self.memories) + len(self.edges)

    def serves(self, profile: Profile, dtype: str, threads: int | None = None) -> bool:
        """Whether its results hold for ``profile`` (the same, or equal), ``dtype`` and ``threads``."""
        return (dtype == self.dtype and threads == self.threads
                and (profile is self.profile or profile == self.profile))

    def signature(self, layer: Layer) -> str:
        """The text that identifies a layer's costs: its node's data but the module."""
        known = self.signatures.get(id(layer))
        if known is not None and known[0] is layer:
            return known[1]
        text = json.dumps({key: value for key, value in layer.items() if key != "module"}, sort_keys=True, default=repr)
        self.signatures[id(layer)] = (layer, text)
        return text

    def check(self, profile: Profile, dtype: str, threads: int | None = None) -> None:
        """Refuse a memo made for another profile, dtype or thread count (its values would be wrong)."""
        if not self.serves(profile, dtype, threads):
            raise ValueError(f"a cost memo for {self.dtype} with profile {self.profile.device.name!r} on "
                             f"{self.threads} threads cannot price {dtype} with profile {profile.device.name!r} on "
                             f"{threads} threads; make one per profile, dtype and thread count")

    def problem(self, signature: str, layer: Layer, layout: Layout) -> LocalProblem | None:
        """``local_problem`` of the layer under ``layout``."""
        key = (signature, layout)
        if key not in self.problems:
            self.problems[key] = layer_problem(layer, layout, self.dtype)  # mixed precision: the layer's dtype
        return self.problems[key]

    def cost(self, name: str, signature: str, layer: Layer, layout: Layout, devices: int,
             cluster: Cluster, overlap: bool = True) -> LayerCost:
        """``layer_cost`` of the layer under ``layout`` on ``devices`` ranks of ``cluster``."""
        cluster = _one_node_normalised(cluster)
        key = (signature, layout, devices, cluster, overlap)
        if key not in self.costs:
            problem = self.problem(signature, layer, layout)
            self.costs[key] = problem_cost(name, layer, layout, problem, devices, self.profile, cluster,
                                           self.itemsize, overlap, compute=self._compute(problem))
        return self.costs[key]

    def _compute(self, problem: LocalProblem | None) -> Compute | None:
        """``compute_s`` of ``problem``, once per local problem (layers and layouts that share one share it)."""
        if problem is None:
            return None
        if problem not in self.computes:
            self.computes[problem] = compute_s(problem, self.profile)
        return self.computes[problem]

    def memory(self, signature: str, layer: Layer, layout: Layout, optimizer: str) -> LayerMemory:
        """``layer_memory`` of the layer under ``layout`` with ``optimizer``'s state."""
        key = (signature, layout, optimizer)
        if key not in self.memories:
            problem = self.problem(signature, layer, layout)
            peaks = None if problem is None else {} if not self.profile.timed(problem.kind) else \
                self.profile.kernel_peak_bytes(problem.kind, problem.key, self.threads)
            self.memories[key] = layer_memory(layer, layout, problem, optimizer, self.itemsize, peaks)
        return self.memories[key]

    def edge_s(self, source: Layer, target: Layer, have: Layout, layout: Layout, devices: int,
               cluster: Cluster) -> float:
        """:func:`cost_models.edges.edge_s` on ``devices`` ranks of ``cluster``."""
        cluster, itemsize = _one_node_normalised(cluster), layer_itemsize(source, self.dtype)
        formed = form_s(source, target, have, layout, self.profile, cluster, itemsize)
        move = edge_move(source, target, have, layout)
        if move is None:
            return formed
        key = (*move, itemsize, devices, cluster)
        if key not in self.edges:
            shape4, held, wanted = move
            self.edges[key] = (redistribution_s(self.profile, cluster, shape4, itemsize, held, wanted, devices)
                               + redistribution_s(self.profile, cluster, shape4, itemsize, wanted, held, devices))
        return formed + self.edges[key]


@lru_cache(maxsize=256)
def _one_node_normalised(cluster: Cluster) -> Cluster:
    """``cluster`` with a node of ``devices`` devices when it is one partly used node: the same costs, one key.

    Costs read the nodes of ranks ``0 … devices − 1`` only (``Cluster.node_of`` refuses others), which are all
    on node 0 whether the node has ``devices`` devices or more.
    """
    if cluster.devices_per_node <= cluster.devices:
        return cluster
    return replace(cluster, devices_per_node=cluster.devices)
