"""Tier 1: the exact solvers agree — shortest path = ILP on chains, ILP = brute force on small DAGs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.solvers.brute_force import solve_brute_force
from planner.solvers.chain import solve_chain
from planner.solvers.cost_table import CostTable
from planner.solvers.elimination import solve_elimination
from planner.solvers.exact import solve_exact
from planner.solvers.ilp import available_solvers, solve_ilp

costs = st.floats(0.0, 10.0, allow_nan=False)


def chain_table(node: list[list[float]], edge: list[list[list[float]]]) -> CostTable:
    layers = tuple(f"l{i}" for i in range(len(node)))
    return CostTable(
        layers=layers,
        options={layer: tuple(f"o{j}" for j in range(len(node[i]))) for i, layer in enumerate(layers)},
        node_s={layer: tuple(node[i]) for i, layer in enumerate(layers)},
        edge_s={(layers[i], layers[i + 1]): tuple(tuple(row) for row in edge[i]) for i in range(len(layers) - 1)},
    )


@st.composite
def chains(draw: st.DrawFn) -> CostTable:
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=8))
    node = [draw(st.lists(costs, min_size=s, max_size=s)) for s in sizes]
    edge = [[draw(st.lists(costs, min_size=b, max_size=b)) for _ in range(a)] for a, b in zip(sizes, sizes[1:])]
    return chain_table(node, edge)


@st.composite
def dags(draw: st.DrawFn) -> CostTable:
    count = draw(st.integers(2, 6))
    layers = tuple(f"l{i}" for i in range(count))
    sizes = {layer: draw(st.integers(2, 4)) for layer in layers}
    edges = {(layers[i - 1], layers[i]) for i in range(1, count)}  # connected backbone
    edges |= {(layers[a], layers[b]) for a in range(count) for b in range(a + 2, count) if draw(st.booleans())}
    memory = {layer: tuple(draw(st.integers(1, 10)) for _ in range(sizes[layer])) for layer in layers}
    return CostTable(
        layers=layers,
        options={layer: tuple(f"o{j}" for j in range(sizes[layer])) for layer in layers},
        node_s={layer: tuple(draw(costs) for _ in range(sizes[layer])) for layer in layers},
        edge_s={(u, v): tuple(tuple(draw(costs) for _ in range(sizes[v])) for _ in range(sizes[u])) for u, v in edges},
        memory_bytes=memory,
        memory_limit_bytes=draw(st.one_of(st.none(), st.integers(sum(min(m) for m in memory.values()), 60))),
    )


def test_known_answer() -> None:
    # Two layers, two options: staying in o0 costs 1+1, switching to the cheap o1 later costs a 5 s shuffle.
    table = chain_table([[1.0, 3.0], [1.0, 0.5]], [[[0.0, 5.0], [5.0, 0.0]]])
    for solution in (solve_chain(table), solve_ilp(table), solve_brute_force(table)):
        assert solution.labels(table) == {"l0": "o0", "l1": "o0"}
        assert solution.objective_s == pytest.approx(2.0)


@settings(max_examples=40, deadline=None)
@given(chains())
def test_shortest_path_equals_the_ilp_on_chains(table: CostTable) -> None:
    path, ilp = solve_chain(table), solve_ilp(table)
    assert ilp.status == "Optimal"
    assert path.objective_s == pytest.approx(table.objective(path.choice))
    assert ilp.objective_s == pytest.approx(path.objective_s, abs=1e-6)


@settings(max_examples=40, deadline=None)
@given(dags())
def test_ilp_equals_brute_force_on_small_dags(table: CostTable) -> None:
    try:
        oracle = solve_brute_force(table)
    except ValueError:
        with pytest.raises(ValueError, match="no feasible plan"):
            solve_ilp(table)
        return
    ilp = solve_ilp(table)
    assert table.fits(ilp.choice)
    assert ilp.objective_s == pytest.approx(oracle.objective_s, abs=1e-6)


def test_memory_limit_changes_the_answer() -> None:
    table = CostTable(layers=("a",), options={"a": ("fast", "lean")}, node_s={"a": (1.0, 2.0)},
                      memory_bytes={"a": (100, 10)}, memory_limit_bytes=50)
    assert solve_ilp(table).labels(table) == {"a": "lean"}
    with pytest.raises(ValueError, match="memory limit needs the ILP"):
        solve_chain(table)
    tight = CostTable(layers=("a",), options={"a": ("x",)}, node_s={"a": (1.0,)}, memory_bytes={"a": (100,)},
                      memory_limit_bytes=10)
    with pytest.raises(ValueError, match="no feasible plan"):
        solve_ilp(tight)


def test_malformed_tables_and_solvers() -> None:
    with pytest.raises(ValueError, match="2 options but 1 costs"):
        CostTable(layers=("a",), options={"a": ("x", "y")}, node_s={"a": (1.0,)})
    with pytest.raises(ValueError, match="against the layer order"):
        CostTable(layers=("a", "b"), options={"a": ("x",), "b": ("x",)}, node_s={"a": (1.0,), "b": (1.0,)},
                  edge_s={("b", "a"): ((0.0,),)})
    table = chain_table([[1.0]], [])
    with pytest.raises(ValueError, match="unknown solver 'gurobi'"):
        solve_ilp(table, solver="gurobi")
    assert "cbc" in available_solvers()


def test_the_solvers_are_pure_python() -> None:
    import subprocess
    import sys

    code = "import sys, planner.solvers.ilp, planner.solvers.chain, planner.solvers.brute_force; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@settings(max_examples=80, deadline=None)
@given(dags())
def test_elimination_equals_brute_force_where_it_applies(table: CostTable) -> None:
    free = CostTable(table.layers, table.options, table.node_s, table.edge_s, table.memory_bytes, None)
    try:
        found = solve_elimination(free)
    except ValueError:
        return  # tree-width above two: the ILP's job
    assert found.objective_s == pytest.approx(solve_brute_force(free).objective_s, rel=1e-9, abs=1e-12)
    assert found.objective_s == pytest.approx(free.objective(found.choice), rel=1e-12, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(dags())
def test_solve_exact_equals_brute_force_with_memory(table: CostTable) -> None:
    assert solve_exact(table).objective_s == pytest.approx(solve_brute_force(table).objective_s, rel=1e-9, abs=1e-9)


def test_elimination_on_a_residual_block() -> None:
    # a → b → c with a skip a → c: a triangle, tree-width two; the skip makes "all o1" the optimum.
    layers = ("a", "b", "c")
    table = CostTable(layers, {name: ("o0", "o1") for name in layers},
                      {"a": (1.0, 1.2), "b": (1.0, 1.1), "c": (1.0, 1.0)},
                      {("a", "b"): ((0.0, 1.0), (1.0, 0.0)), ("b", "c"): ((0.0, 1.0), (1.0, 0.0)),
                       ("a", "c"): ((5.0, 5.0), (5.0, 0.0))})
    found = solve_elimination(table)
    assert found.labels(table) == {"a": "o1", "b": "o1", "c": "o1"}
    assert found.objective_s == pytest.approx(3.3)
