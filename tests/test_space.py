"""Tier 2: the search space built from a traced model, and the exact solvers on it."""

from __future__ import annotations

import pytest

from calibrate.presets import preset_cluster, preset_profile
from conftest import build_model
from cost_models.graph import trace
from cost_models.layout import Layout
from planner.chain import solve_chain
from planner.ilp import solve_ilp
from cost_models.layout import layouts_dividing
from planner.space import build_space


def test_layouts_dividing() -> None:
    assert {str(layout) for layout in layouts_dividing(2)} == {"n1", "n2", "c2", "h2", "w2"}
    assert len(layouts_dividing(4)) == 15


@pytest.fixture(scope="module")
def unet_space():  # noqa: ANN201
    graph = trace(build_model("unet"), (2, 3, 64, 64))
    return graph, build_space(graph, preset_profile("a100"), preset_cluster("a100", 2), 2)


def test_candidates_respect_kinds_and_shapes(unet_space) -> None:  # noqa: ANN001
    graph, space = unet_space
    assert set(space.candidates) == set(graph.compute_layers())
    head = space.candidates["head"]
    assert Layout(n=2) in head and Layout(h=2) in head and Layout(c=2) in head
    for name, layouts in space.candidates.items():
        if graph.nodes[name]["kind"] == "cat":
            assert all(layout.c == 1 for layout in layouts)  # concatenation along channels is never channel-split


def test_the_ilp_plan_beats_both_baselines_on_its_objective(unet_space) -> None:  # noqa: ANN001
    graph, space = unet_space
    table = space.table
    best = solve_ilp(table)
    assert best.status == "Optimal"
    sample = {name: table.options[name].index("n2") for name in table.layers}
    assert best.objective_s <= table.objective(sample) + 1e-12
    for label in ("n1", "n2", "h2", "w2"):
        if all(label in table.options[name] for name in table.layers):
            uniform = {name: table.options[name].index(label) for name in table.layers}
            assert best.objective_s <= table.objective(uniform) + 1e-12


def test_on_a_chain_model_the_ilp_equals_the_shortest_path() -> None:
    graph = trace(build_model("vgg11"), (2, 3, 32, 32))
    space = build_space(graph, preset_profile("a100"), preset_cluster("a100", 2), 2)
    assert space.table.is_chain()
    assert solve_ilp(space.table).objective_s == pytest.approx(solve_chain(space.table).objective_s, rel=1e-9, abs=1e-12)
