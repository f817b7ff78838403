"""Tier 2: the search finds what it found before it was made fast — its memos and shortcuts change no value.

Issue 18 (a conformance suite plans some 200 models twice each) made the search fast: layer costs kept per
layer signature and layout across stages, plans and device counts (``cost_models.estimate.CostMemo``), moves
priced once per tensor shape (``planner.edge_costs``), elimination ordered by a heap, one-option stages of
denser graphs taken without the ILP. :data:`REFERENCES` are the plans, predicted times, the plans considered
and the baselines the search finds, float for float: at commit 47b41cc they were those of the search before
those changes (commit 10c2ab6); since, a convolution whose tile reads zero rows of its padding has a local
problem (two resnet18 references gained spatial options); since 2026-12-03 weight gradients are priced as
their share of a 25 MiB bucket's allreduce (``comm_cost.gradient_allreduce_s``), not one allreduce each; since 2026-12-03 (issue 21) memory is the step's peak layer by layer (a kept tensor counted
once, 1F1B's in-flight micro-batches, calibrated kernel workspace); since 2026-12-04 (issue 23) a stale plan's
staleness is the least that keeps its predicted pace (the same times, fewer stashed inputs), and stage cuts are
exact (``planner.pipeline.cuts``; one resnet18 pipeline 0.6 % faster); since 2026-12-04 the configurations' bounds are
summed lazily, so more count as skipped (a configuration whose bound passes the best plan before a layer without
layouts is met), every micro-batch count from K up is a configuration and stages may take different device
counts (3 stages of 4 devices: 2 + 1 + 1) — the plans and every plan considered the same; since 2026-12-05 a stale
configuration's bound counts the forward it recomputes (DSP's ``2F + B``), so one more is skipped; since 2026-12-05
a pipeline may use half, a quarter … of the devices (``planner.pipeline.sizes.budgets``), three more configurations,
all skipped. A change of the cost model, of the capability
predicate or of the presets changes them on purpose: print the new ones with
``.venv/bin/python tests/test_planning_reference.py`` and review the difference.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

from calibrate.presets import preset_cluster, preset_profile
from cost_models.cluster import Cluster
from cost_models.estimate import CostMemo, estimate
from cost_models.ir.tracing import trace
from cost_models.layout import Layout, layouts_dividing
from cost_models.uniform import staged, uniform_plan
from planner.edge_costs import EdgeCosts
from planner.search import PlanResult, plan_model
from planner.settings import SearchSettings
from planner.solvers.cost_table import CostTable
from planner.solvers.exact import solve_exact
from planner.solvers.ilp import solve_ilp


class _Case(NamedTuple):
    model: str
    shape: tuple[int, int, int, int]
    devices: int
    per_node: int | None  # None: the preset's node (4 V100s)
    max_stages: int


@dataclass(frozen=True)
class _Found:
    summary: str
    iteration_s: float
    memory_bytes_max: int
    chosen_from: str
    skipped: int
    considered: tuple[tuple[str, float], ...]
    baselines: tuple[tuple[str, float], ...]


REFERENCES = {
    _Case(model='resnet18', shape=(4, 3, 32, 32), devices=2, per_node=None, max_stages=4): _Found(summary='n1 (69); 2 stages stale≤1', iteration_s=0.0008386200951976541, memory_bytes_max=85737280, chosen_from='search', skipped=2, considered=(('c2 (46), n2 (23); 1 stage', 0.001036260797737107), ('n2 (52), c2 (17); 1 stage', 0.0010051182377371075), ('n1 (69); 2 stages stale≤1', 0.0008386200951976541), ('n1 (69); 2 stages stale≤1', 0.0008386200951976541)), baselines=(('pure sample', 0.0011136848184188344), ('best single layout (c2)', 0.0010725639445637437))),
    _Case(model='resnet18', shape=(4, 3, 32, 32), devices=4, per_node=None, max_stages=4): _Found(summary='n1 (69); 4 stages stale≤3', iteration_s=0.0004391258391669194, memory_bytes_max=41893696, chosen_from='search', skipped=9, considered=(('n4 (36), c4 (33); 1 stage', 0.0010600984898971994), ('n4 (53), n2·c2 (13), c4 (3); 1 stage', 0.001000159868944819), ('n1 (69); 4 stages stale≤3', 0.0004391258391669194), ('n1 (69); 4 stages stale≤3', 0.0004391258391669194)), baselines=(('best single layout (c4)', 0.0012263942618056804),)),
    _Case(model='resnet18', shape=(4, 3, 32, 32), devices=4, per_node=2, max_stages=4): _Found(summary='n1 (69); 4 stages stale≤3', iteration_s=0.0004391258391669194, memory_bytes_max=41893696, chosen_from='search', skipped=9, considered=(('c2·w2 (27), n4 (21), n2·c2 (19), n2·w2 (2); 1 stage', 0.003751415352743941), ('n4 (53), n2·c2 (16); 1 stage', 0.0044183794670192705), ('n1 (69); 4 stages stale≤3', 0.0004391258391669194), ('n1 (69); 4 stages stale≤3', 0.0004391258391669194)), baselines=(('best single layout (c2·w2; n2·c2, n4 where it does not apply)', 0.0038348010126094765),)),
    _Case(model='squeezenet1_0', shape=(4, 3, 64, 64), devices=2, per_node=None, max_stages=4): _Found(summary='n1 (66); 2 stages stale≤2', iteration_s=0.0007200161057931454, memory_bytes_max=10256832, chosen_from='search', skipped=2, considered=(('n2 (62), c2 (4); 1 stage', 0.0009117396582306988), ('n2 (66); 1 stage', 0.0009092657458497466), ('n1 (66); 2 stages stale≤2', 0.0007200161057931454), ('n1 (66); 2 stages stale≤2', 0.0007200161057931454)), baselines=(('pure sample', 0.0009092657458497466), ('best single layout (n2)', 0.0009092657458497466))),
    _Case(model='squeezenet1_0', shape=(4, 3, 64, 64), devices=4, per_node=None, max_stages=4): _Found(summary='n1 (66); 4 stages stale≤3', iteration_s=0.00037185616904256396, memory_bytes_max=7864640, chosen_from='search', skipped=9, considered=(('n4 (62), c4 (4); 1 stage', 0.0008669791829137125), ('n4 (66); 1 stage', 0.0008547183143422842), ('n1 (66); 4 stages stale≤3', 0.00037185616904256396), ('n1 (66); 4 stages stale≤3', 0.00037185616904256396)), baselines=(('pure sample', 0.0008547183143422842), ('best single layout (n4)', 0.0008547183143422842))),
    _Case(model='squeezenet1_0', shape=(4, 3, 64, 64), devices=4, per_node=2, max_stages=4): _Found(summary='n1 (66); 4 stages stale≤4', iteration_s=0.00037185616904256396, memory_bytes_max=7864640, chosen_from='search', skipped=9, considered=(('n4 (62), n2·c2 (4); 1 stage', 0.0008744339624821639), ('n4 (66); 1 stage', 0.0008588868615297841), ('n1 (66); 4 stages stale≤4', 0.00037185616904256396), ('n1 (66); 4 stages stale≤4', 0.00037185616904256396)), baselines=(('pure sample', 0.0008588868615297841), ('best single layout (n4)', 0.0008588868615297841))),
    _Case(model='mobilenet_v3_small', shape=(4, 3, 32, 32), devices=2, per_node=None, max_stages=4): _Found(summary='n1 (157); 2 stages stale≤1', iteration_s=0.0013696255498534021, memory_bytes_max=19176192, chosen_from='search', skipped=2, considered=(('n2 (153), c2 (4); 1 stage', 0.0018806750539095746), ('n2 (156), c2 (1); 1 stage', 0.001880308143433384), ('n1 (157); 2 stages stale≤1', 0.0013696255498534021), ('n1 (157); 2 stages stale≤1', 0.0013696255498534021)), baselines=(('pure sample', 0.0018839938348619554), ('best single layout (n2)', 0.0018839938348619554))),
    _Case(model='mobilenet_v3_small', shape=(4, 3, 32, 32), devices=4, per_node=None, max_stages=4): _Found(summary='n1 (157); 4 stages stale≤3', iteration_s=0.0006930836781720757, memory_bytes_max=17659968, chosen_from='search', skipped=9, considered=(('n4 (122), n2·c2 (31), c4 (4); 1 stage', 0.0019969208655564413), ('n4 (126), n2·c2 (31); 1 stage', 0.001988629756985013), ('n1 (157); 4 stages stale≤3', 0.0006930836781720757), ('n1 (157); 4 stages stale≤3', 0.0006930836781720757)), baselines=(('best single layout (n4; n2·c2 where it does not apply)', 0.001988629756985013),)),
    _Case(model='mobilenet_v3_small', shape=(4, 3, 32, 32), devices=4, per_node=2, max_stages=4): _Found(summary='n1 (157); 4 stages stale≤3', iteration_s=0.0006930836781720757, memory_bytes_max=17659968, chosen_from='search', skipped=9, considered=(('n4 (122), n2·c2 (35); 1 stage', 0.002041860396685533), ('n4 (126), n2·c2 (31); 1 stage', 0.0020312873833521995), ('n1 (157); 4 stages stale≤3', 0.0006930836781720757), ('n1 (157); 4 stages stale≤3', 0.0006930836781720757)), baselines=(('best single layout (n4; n2·c2 where it does not apply)', 0.0020312873833521995),)),
    _Case(model='dense', shape=(4, 3, 16, 16), devices=2, per_node=None, max_stages=4): _Found(summary='n1 (28); 2 stages stale≤1', iteration_s=0.00026144146411889605, memory_bytes_max=864280, chosen_from='search', skipped=2, considered=(('n2 (28); 1 stage', 0.0003237512035133858), ('n2 (28); 1 stage', 0.0003237512035133858), ('n1 (28); 2 stages stale≤1', 0.00026144146411889605), ('n1 (28); 2 stages stale≤1', 0.00026144146411889605)), baselines=(('pure sample', 0.0003237512035133858), ('best single layout (n2)', 0.0003237512035133858))),
    _Case(model='dense', shape=(4, 3, 16, 16), devices=4, per_node=None, max_stages=4): _Found(summary='n1 (28); 4 stages stale≤4', iteration_s=0.0001366930431301183, memory_bytes_max=1102080, chosen_from='search', skipped=9, considered=(('n4 (28); 1 stage', 0.00031942882551134317), ('n4 (28); 1 stage', 0.00031942882551134317), ('n1 (28); 4 stages stale≤4', 0.0001366930431301183), ('n1 (28); 4 stages stale≤4', 0.0001366930431301183)), baselines=(('pure sample', 0.00031942882551134317), ('best single layout (n4)', 0.00031942882551134317))),
    _Case(model='dense', shape=(4, 3, 16, 16), devices=4, per_node=2, max_stages=4): _Found(summary='n1 (28); 4 stages stale≤5', iteration_s=0.0001366930431301183, memory_bytes_max=1396992, chosen_from='search', skipped=9, considered=(('n4 (28); 1 stage', 0.00031949454584988485), ('n4 (28); 1 stage', 0.00031949454584988485), ('n1 (28); 4 stages stale≤5', 0.0001366930431301183), ('n1 (28); 4 stages stale≤5', 0.0001366930431301183)), baselines=(('pure sample', 0.00031949454584988485), ('best single layout (n4)', 0.00031949454584988485))),
    _Case(model='resnet18', shape=(8, 3, 64, 64), devices=4, per_node=2, max_stages=1): _Found(summary='c2·w2 (30), n4 (30), n2·w2 (6), n2·c2 (3); 1 stage', iteration_s=0.001651962744413522, memory_bytes_max=59273632, chosen_from='search', skipped=0, considered=(('c2·w2 (30), n4 (30), n2·w2 (6), n2·c2 (3); 1 stage', 0.001651962744413522), ('n4 (56), n2·c2 (13); 1 stage', 0.004546914044331217)), baselines=(('pure sample', 0.004888721456771696), ('best single layout (c2·w2; n4 where it does not apply)', 0.002296186342833734))),
}


def _dense_net() -> Any:
    """Six layers each reading the concatenation of all before it (DenseNet's block): tree-width above two."""
    import torch
    from torch import nn

    class Dense(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.layers = nn.ModuleList(nn.Sequential(nn.BatchNorm2d(8 + 4 * i), nn.ReLU(),
                                                      nn.Conv2d(8 + 4 * i, 4, 3, padding=1)) for i in range(6))
            self.head = nn.Linear(32, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            features = [self.stem(x)]
            for layer in self.layers:
                features.append(layer(torch.cat(features, 1)))
            return self.head(torch.cat(features, 1).mean((2, 3)))

    return Dense()


@cache
def _graph(model: str, shape: tuple[int, ...]) -> Any:
    import torch
    import torchvision

    torch.manual_seed(0)
    return trace(_dense_net() if model == "dense" else torchvision.models.get_model(model, weights=None), shape)


def _cluster(devices: int, per_node: int | None) -> Cluster:
    cluster = preset_cluster("v100", devices)
    return cluster if per_node is None else replace(cluster, devices_per_node=per_node)


def _plan(case: _Case) -> PlanResult:
    return plan_model(_graph(case.model, case.shape), preset_profile("v100"), _cluster(case.devices, case.per_node),
                      SearchSettings(max_stages=case.max_stages))


def _found(result: PlanResult) -> _Found:
    return _Found(result.plan.summary(), result.estimate.iteration_s, result.estimate.memory_bytes_max,
                  result.chosen_from, result.skipped_configurations,
                  tuple((c.summary, c.iteration_s) for c in result.considered),
                  tuple((b.name, b.estimate.iteration_s) for b in result.baselines))


@pytest.mark.parametrize("case", list(REFERENCES), ids=lambda case: "-".join(map(str, case)))
def test_the_search_finds_the_plans_it_found_before_it_was_made_fast(case: _Case) -> None:
    assert _found(_plan(case)) == REFERENCES[case]


def test_a_search_right_after_one_of_the_same_graph_finds_what_a_fresh_one_finds() -> None:
    two, four = _Case("squeezenet1_0", (4, 3, 64, 64), 2, None, 4), _Case("squeezenet1_0", (4, 3, 64, 64), 4, None, 4)
    _plan(_Case("resnet18", (4, 3, 32, 32), 2, None, 1))  # another graph: the next search starts afresh
    fresh = _found(_plan(four))
    _plan(two)  # its stage costs are the next search's
    assert _found(_plan(four)) == fresh == REFERENCES[four]


def test_estimates_sharing_a_memo_equal_estimates_alone() -> None:
    graph, profile = _graph("resnet18", (4, 3, 32, 32)), preset_profile("v100")
    cluster = _cluster(4, 2)
    plans = [uniform_plan(graph, cluster, [layout, Layout(n=4), Layout()])
             for layout in (Layout(n=4), Layout(c=4), Layout(h=2, w=2), Layout(n=2, h=2), Layout(c=2, w=2))]
    pipeline = uniform_plan(graph, _cluster(2, 2), [Layout(c=2), Layout()])
    starts = [graph.compute_layers()[len(graph.compute_layers()) // 2]]
    plans += [staged(pipeline, graph, starts, "sync", micro_batches=2), staged(pipeline, graph, starts, "stale")]
    memo = CostMemo(profile, graph.graph["dtype"])
    for plan in plans + plans:  # the second time from the memo
        assert estimate(graph, plan, profile, memo=memo) == estimate(graph, plan, profile)
    with pytest.raises(ValueError, match="cannot price"):
        estimate(graph, plans[0], preset_profile("a100"), memo=memo)


def test_moves_priced_for_other_layouts_first_give_the_same_matrices_and_pairs_their_diagonal() -> None:
    graph, profile = _graph("resnet18", (4, 3, 32, 32)), preset_profile("v100")
    cluster = _cluster(4, 2)
    layouts = tuple(layout for layout in layouts_dividing(4) if layout.ranks in (2, 4))
    primed = EdgeCosts(graph, profile, cluster, 4, 4)
    for source, target in (("layer1_0_relu", "layer1_0_conv2"), ("layer2_0_bn2", "add_2"), ("flatten", "fc")):
        for haves, wants in ((layouts[:3], layouts[-3:]), (layouts[::2], layouts[1::2]), (layouts[-1:], layouts)):
            primed.matrix(source, target, haves, wants)
        matrix = primed.matrix(source, target, layouts, layouts)
        assert np.array_equal(matrix, EdgeCosts(graph, profile, cluster, 4, 4).matrix(source, target, layouts,
                                                                                        layouts)), (source, target)
        shuffled = layouts[::-1]  # pairs of unequal layouts too
        for costs in (primed, EdgeCosts(graph, profile, cluster, 4, 4)):  # moves priced before, or only these
            assert np.array_equal(costs.pairs(source, target, layouts, shuffled),
                                  np.diagonal(matrix[:, ::-1])), (source, target)


def test_one_option_per_layer_of_a_dense_graph_is_solved_without_the_ilp() -> None:
    layers = ("a", "b", "c", "d", "e")  # every pair joined: tree-width four
    edges = {(u, v): ((0.5 + index,),) for index, (u, v) in enumerate(itertools.combinations(layers, 2))}
    table = CostTable(layers, {layer: ("n1",) for layer in layers}, {layer: (1.0,) for layer in layers}, edges,
                      {layer: (10,) for layer in layers}, 100)
    found = solve_exact(table)
    assert (found.solver, found.status, found.choice) == ("forced", "Optimal", dict.fromkeys(layers, 0))
    assert found.objective_s == solve_ilp(table).objective_s
    with pytest.raises(Exception, match="no plan fits"):  # what does not fit is the ILP's to explain
        solve_exact(replace(table, memory_limit_bytes=49))


def _print_references() -> None:
    """The references as this checkout finds them, in the form of :data:`REFERENCES`."""
    for case in REFERENCES:
        found = _found(_plan(case))
        print(f"    {case!r}: {found!r},")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    _print_references()
