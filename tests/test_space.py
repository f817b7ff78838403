"""Tier 2: the search space built from a traced model, and the exact solvers on it."""

from __future__ import annotations

import networkx as nx
import pytest
from conftest import build_model

from calibrate.presets import preset_cluster, preset_profile
from cost_models.ir.tracing import trace
from cost_models.layout import Layout, layouts_dividing
from planner.solvers.chain import solve_chain
from planner.solvers.exact import solve_exact
from planner.solvers.ilp import solve_ilp
from planner.space import build_space, decision_groups


def test_layouts_dividing() -> None:
    assert {str(layout) for layout in layouts_dividing(2)} == {"n1", "n2", "c2", "h2", "w2"}
    assert len(layouts_dividing(4)) == 15


@pytest.fixture(scope="module")
def unet_space():  # noqa: ANN201
    graph = trace(build_model("unet"), (2, 3, 64, 64))
    return graph, build_space(graph, preset_profile("a100"), preset_cluster("a100", 2), 2)


def test_decisions_cover_every_layer_once_and_followers_share_their_producer(unet_space) -> None:  # noqa: ANN001
    graph, space = unet_space
    members = [layer for group in space.members.values() for layer in group]
    assert sorted(members) == sorted(graph.compute_layers())
    for head, group in space.members.items():
        for follower in group[1:]:
            assert graph.nodes[follower]["kind"] in ("batchnorm", "activation", "dropout", "identity", "add", "mul",
                                                      "elementwise")
        assert set(space.candidates[head]) <= {Layout(n=2), Layout(c=2), Layout(h=2), Layout(w=2)}  # all devices


def test_candidates_respect_kinds_and_shapes(unet_space) -> None:  # noqa: ANN001
    graph, space = unet_space
    unpruned = build_space(graph, preset_profile("a100"), preset_cluster("a100", 2), 2, prune=False)
    head = unpruned.candidates["head"]
    assert Layout(n=2) in head and Layout(h=2) in head and Layout(c=2) in head
    for name, layouts in unpruned.candidates.items():
        if graph.nodes[name]["kind"] == "cat":
            assert all(layout.c == 1 for layout in layouts)  # concatenation along channels is never channel-split


def test_pruning_keeps_the_optimum() -> None:
    graph = trace(build_model("resnet18"), (4, 3, 128, 128))
    profile, cluster = preset_profile("v100"), preset_cluster("v100", 4)
    pruned = build_space(graph, profile, cluster, 4, memory_limit_bytes=cluster.memory_bytes)
    full = build_space(graph, profile, cluster, 4, memory_limit_bytes=cluster.memory_bytes, prune=False)
    assert pruned.pruned > 0 and full.pruned == 0
    for small, large in ((pruned.table, full.table), (pruned.hidden_allreduce, full.hidden_allreduce)):
        assert solve_exact(small).objective_s == pytest.approx(solve_exact(large).objective_s, rel=1e-9)


def test_the_exact_plan_beats_every_uniform_layout_on_its_objective(unet_space) -> None:  # noqa: ANN001
    graph, space = unet_space
    best = solve_ilp(space.table)
    assert best.status == "Optimal"
    assert best.objective_s == pytest.approx(solve_exact(space.table).objective_s, rel=1e-9)
    assert space.uniform_s
    for objective in space.uniform_s.values():
        assert best.objective_s <= objective + 1e-12


def test_on_a_chain_model_the_ilp_equals_the_shortest_path() -> None:
    graph = trace(build_model("vgg11"), (2, 3, 32, 32))
    space = build_space(graph, preset_profile("a100"), preset_cluster("a100", 2), 2)
    assert space.table.is_chain()
    assert solve_ilp(space.table).objective_s == pytest.approx(solve_chain(space.table).objective_s, rel=1e-9, abs=1e-12)


def test_an_add_that_would_close_a_circle_is_its_own_decision() -> None:
    import torch
    from torch import nn

    class Loop(nn.Module):  # out = y + conv2(relu(y)): following y would make the decisions depend on each other
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.conv2, self.relu = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 1), nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.conv1(x)
            return y + self.conv2(self.relu(y))

    graph = trace(Loop(), (2, 3, 8, 8))
    groups = decision_groups(graph)
    add = next(name for name in graph.compute_layers() if graph.nodes[name]["kind"] == "add")
    assert add in groups and groups["conv1"] == ("conv1", "relu")
    head_of = {layer: head for head, members in groups.items() for layer in members}
    contracted = nx.DiGraph((head_of[u], head_of[v]) for u, v in graph.edges
                            if u in head_of and v in head_of and head_of[u] != head_of[v])
    assert nx.is_directed_acyclic_graph(contracted)


@pytest.mark.parametrize("devices", [8, 6])
def test_edge_matrices_equal_the_estimate_edge_costs(devices: int) -> None:
    from cost_models.cluster import Cluster
    from cost_models.edges import edge_s
    from cost_models.ir.graph import dtype_itemsize
    from planner.edge_costs import EdgeCosts

    graph = trace(build_model("resnet18"), (12, 3, 32, 32))
    profile = preset_profile("a100")
    cluster = Cluster(devices, 2, 10**10, preset_cluster("a100", 8).intra, preset_cluster("a100", 16).inter)
    costs = EdgeCosts(graph, profile, cluster, devices, dtype_itemsize("float32"))
    layouts = tuple(layout for layout in layouts_dividing(devices) if layout.ranks == devices)
    for source, target in (("layer1_0_relu", "layer1_0_conv2"), ("avgpool", "flatten"), ("flatten", "fc"),
                           ("layer2_0_bn2", "add_2")):
        src, dst = graph.nodes[source], graph.nodes[target]
        fits = tuple(layout for layout in layouts if _splits(src["output_shape"], layout))
        matrix = costs.matrix(source, target, fits, fits)
        for i, have in enumerate(fits):
            for j, want in enumerate(fits):
                expected = edge_s(src, dst, have, want, devices, profile, cluster, 4)
                assert matrix[i, j] == pytest.approx(expected, rel=1e-12, abs=1e-15), (source, have, want)


def _splits(shape: list[int], layout: Layout) -> bool:
    if len(shape) == 4:
        return layout.fits(tuple(shape))
    return layout.h == layout.w == 1 and shape[0] >= layout.n and shape[1] >= layout.c


class _CountingGraph:
    """A read-only view of a LayerGraph that refuses to be read more than ``passes`` times over (no endless loop)."""

    def __init__(self, graph: nx.DiGraph, passes: int) -> None:
        self.graph, self.budget = graph, passes * graph.number_of_nodes()

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.graph, name)

    def predecessors(self, name: str):  # noqa: ANN201
        self.budget -= 1
        if self.budget < 0:
            raise AssertionError("decision_groups re-read the graph more than its passes allow: it does not converge")
        return self.graph.predecessors(name)


def _assert_groups_sound(graph: nx.DiGraph, groups: dict[str, tuple[str, ...]]) -> None:
    """Every layer placed once; each merged layer descends from its decision's head; the decisions form a DAG."""
    assert sorted(layer for members in groups.values() for layer in members) == sorted(graph.compute_layers())
    for head, members in groups.items():
        assert members[0] == head
        for member in members[1:]:
            assert nx.has_path(graph, head, member), (head, member)
    head_of = {layer: head for head, members in groups.items() for layer in members}
    contracted = nx.DiGraph()
    contracted.add_nodes_from(groups)
    contracted.add_edges_from((head_of[u], head_of[v]) for u, v in graph.edges
                              if u in head_of and v in head_of and head_of[u] != head_of[v])
    assert nx.is_directed_acyclic_graph(contracted)
    position = {head: index for index, head in enumerate(groups)}
    assert all(position[u] < position[v] for u, v in contracted.edges)  # the decisions come in topological order


def _squeeze_residual():  # noqa: ANN202 - an nn.Module
    import torch
    from torch import nn

    class SqueezeResidual(nn.Module):  # a squeeze-excitation product whose full input comes first, inside a residual
        def __init__(self) -> None:
            super().__init__()
            self.conv0, self.conv1 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)
            self.conv2, self.fc = nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1)
            self.relu, self.pool = nn.ReLU(), nn.AdaptiveAvgPool2d(1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.conv0(x)
            a = self.relu(self.conv1(y))
            return y + self.conv2(a * torch.sigmoid(self.fc(self.pool(a))))

    return SqueezeResidual()


def test_decisions_stay_acyclic_when_a_cycle_runs_through_a_layer_already_its_own() -> None:
    # Both the product (whose scale is computed from its first input) and the residual add (whose second input is
    # computed from its first) would close a circle; the circle through the add also runs through the product. The
    # former fixed-point loop kept making the product its own decision again and never ended.
    graph = trace(_squeeze_residual(), (2, 3, 8, 8))
    groups = decision_groups(_CountingGraph(graph, passes=3))
    _assert_groups_sound(graph, groups)
    assert groups["conv1"] == ("conv1", "relu") and groups["fc"] == ("fc", "sigmoid")
    assert "mul" in groups and "add" in groups  # both their own decisions
    assert groups["conv0"] == ("conv0",)


def test_efficientnet_micro_batched_graph_keeps_argument_order_and_sound_decisions() -> None:
    import torchvision

    from cost_models.ir.micro_batches import micro_batch_graph

    graph = trace(torchvision.models.efficientnet_b0(), (2, 3, 64, 64))
    scaled = micro_batch_graph(graph, 2)
    assert all(list(scaled.predecessors(name)) == list(graph.predecessors(name)) for name in graph)
    assert scaled.nodes[graph.compute_layers()[0]]["output_shape"][0] == 1  # one sample per micro-batch
    for subject in (graph, scaled, graph.copy()):  # networkx's copy orders inputs by producer: other decisions
        groups = decision_groups(_CountingGraph(subject, passes=3))
        _assert_groups_sound(subject, groups)
    assert decision_groups(scaled) == decision_groups(graph)


def test_splits_exactly_agrees_with_the_layouts_of_the_space() -> None:
    """``splits_exactly`` (samples and channels by divisors, the rest in the space's grids) says what the space's
    first tier of layouts says, without enumerating every layout of the device count."""
    import json

    from planner.layout_space import _tiers, splits_exactly

    for shape in ([64, 64, 1024, 1024], [12, 64, 48, 48], [4, 32, 64, 64, 64], [6, 10, 30, 30], [8, 1000]):
        for devices in range(1, 130):
            for per_node in (1, 4, 8):
                node = min(per_node, devices)
                assert splits_exactly(shape, devices, node) == bool(_tiers(json.dumps(shape), devices, node)[0]), (
                    shape, devices, node)


def test_a_micro_batch_scales_what_the_batch_flows_into_not_filters_made_from_parameters() -> None:
    """A weight-standardised convolution (``F.conv2d(x, standardise(w))``) on a micro-batch: its input and output
    halve with the batch; its filters — computed from the parameter alone — keep their 8 output channels, as the
    runtime's trace at the micro-batch's shape has them (the same in the estimate's and the planner's graphs)."""
    import torch
    from torch import nn

    from cost_models.estimate import _micro_batch_nodes
    from cost_models.ir.micro_batches import micro_batch_graph

    class Standardised(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(8, 3, 3, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            w = (self.weight - self.weight.mean()) / (self.weight.std() + 1e-5)
            return nn.functional.conv2d(x, w, padding=1)

    graph = trace(Standardised(), (8, 3, 16, 16))
    conv = next(name for name in graph.compute_layers() if graph.nodes[name]["kind"] == "conv")
    for nodes in (micro_batch_graph(graph, 2).nodes, _micro_batch_nodes(graph, 2)):
        assert nodes[conv]["input_shapes"] == [[4, 3, 16, 16], [8, 3, 3, 3]]
        assert nodes[conv]["output_shape"] == [4, 8, 16, 16]
    retraced = trace(Standardised(), (4, 3, 16, 16))
    assert retraced.nodes[conv]["input_shapes"] == [[4, 3, 16, 16], [8, 3, 3, 3]]
