"""Tier 1: the ILP without PuLP — ``scipy.optimize.milp`` solves the same program to the same optimum.

Every table is solved by both back ends (PuLP's CBC when PuLP is installed,
and SciPy's HiGHS, forced through ``planner.solvers.ilp.BACKEND``) and by brute force:
equal optimal objectives, a choice that fits, infeasibility reported alike.
The tables are seeded versions of ``tests/test_solvers.py``'s random DAGs (no
hypothesis: it may be missing where the fallback matters), the k-best table of
``tests/test_validate.py`` and the traced UNet's search space of
``tests/test_space.py``.
"""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import planner.solvers.ilp as ilp
from planner.solvers.brute_force import solve_brute_force
from planner.solvers.cost_table import CostTable, Solution
from planner.solvers.ilp import solve_ilp
from planner.solvers.ilp_backends import SCIPY_SOLVER, pulp_available

REPO = Path(__file__).resolve().parents[1]


def solve_with(backend: str, table: CostTable, **options: object) -> Solution:
    """``solve_ilp`` on one back end (``pulp`` or ``scipy``)."""
    saved = ilp.BACKEND
    ilp.BACKEND = backend
    try:
        return solve_ilp(table, **options)  # type: ignore[arg-type]
    finally:
        ilp.BACKEND = saved


def backends() -> list[str]:
    return ["scipy"] + (["pulp"] if pulp_available() else [])


def random_dag(seed: int) -> CostTable:
    """A DAG of 2–6 layers with 2–4 options, a backbone and random skips, memory and sometimes a limit."""
    draw = random.Random(seed)
    count = draw.randint(2, 6)
    layers = tuple(f"l{i}" for i in range(count))
    sizes = {layer: draw.randint(2, 4) for layer in layers}
    edges = {(layers[i - 1], layers[i]) for i in range(1, count)}
    edges |= {(layers[a], layers[b]) for a in range(count) for b in range(a + 2, count) if draw.random() < 0.5}
    memory = {layer: tuple(draw.randint(1, 10) for _ in range(sizes[layer])) for layer in layers}
    least = sum(min(m) for m in memory.values())
    return CostTable(
        layers=layers,
        options={layer: tuple(f"o{j}" for j in range(sizes[layer])) for layer in layers},
        node_s={layer: tuple(draw.uniform(0.0, 10.0) for _ in range(sizes[layer])) for layer in layers},
        edge_s={(u, v): tuple(tuple(draw.uniform(0.0, 10.0) for _ in range(sizes[v])) for _ in range(sizes[u]))
                for u, v in sorted(edges)},
        memory_bytes=memory,
        memory_limit_bytes=draw.choice([None, draw.randint(max(1, least - 3), 60)]),
    )


def k_best_table() -> CostTable:
    """``tests/test_validate.py``'s three layers of three options with a skip."""
    layers = ("a", "b", "c")
    node = {"a": (1.0, 2.0, 4.0), "b": (3.0, 1.0, 2.5), "c": (2.0, 2.0, 1.0)}
    edge = {("a", "b"): ((0.0, 1.5, 0.7), (1.0, 0.0, 2.0), (0.3, 0.2, 0.0)),
            ("a", "c"): ((0.0, 0.4, 1.1), (0.5, 0.0, 0.6), (1.2, 0.9, 0.0))}
    return CostTable(layers, {layer: ("x", "y", "z") for layer in layers}, node, edge)


@pytest.mark.parametrize("seed", range(40))
def test_both_back_ends_find_the_brute_force_optimum(seed: int) -> None:
    table = random_dag(seed)
    try:
        oracle = solve_brute_force(table)
    except ValueError:
        for backend in backends():
            with pytest.raises(ValueError, match="no feasible plan"):
                solve_with(backend, table)
        return
    for backend in backends():
        found = solve_with(backend, table)
        assert found.status == "Optimal" and found.gap == 0.0
        assert table.fits(found.choice), backend
        assert set(found.choice) == set(table.layers)
        assert found.objective_s == pytest.approx(table.objective(found.choice), rel=1e-12)
        assert found.objective_s == pytest.approx(oracle.objective_s, abs=1e-6), backend


def test_the_scipy_back_end_names_itself_and_checks_solver_names() -> None:
    table = k_best_table()
    found = solve_with("scipy", table, solver="highs", time_limit_s=30.0)
    assert found.solver == SCIPY_SOLVER and found.status == "Optimal"
    assert solve_with("scipy", table, solver="cbc").objective_s == found.objective_s
    with pytest.raises(ValueError, match="unknown solver 'gurobi'; use one of cbc, highs"):
        solve_with("scipy", table, solver="gurobi")


def test_excluding_each_optimum_lists_the_same_k_best_plans() -> None:
    table = k_best_table()
    every = sorted(table.objective(dict(zip(table.layers, c))) for c in itertools.product(range(3), repeat=3))
    for backend in backends():
        found, excluded = [], []
        for _ in range(6):
            solution = solve_with(backend, table, exclude=excluded)
            excluded.append(solution.choice)
            found.append(solution.objective_s)
        assert found == pytest.approx(every[:6]), backend
        assert len({tuple(c.values()) for c in excluded}) == 6


def test_a_minimum_difference_is_kept_by_both() -> None:
    table = k_best_table()
    first = solve_with("scipy", table)
    candidates = [dict(zip(table.layers, c)) for c in itertools.product(range(3), repeat=3)]
    far = [c for c in candidates if sum(c[layer] != first.choice[layer] for layer in table.layers) >= 2]
    for backend in backends():
        second = solve_with(backend, table, exclude=[first.choice], min_difference=2)
        assert sum(first.choice[layer] != second.choice[layer] for layer in table.layers) >= 2
        assert second.objective_s == pytest.approx(min(table.objective(c) for c in far))


def test_an_excluded_plan_of_another_table_is_refused() -> None:
    with pytest.raises(ValueError, match="layer 'a' option 7, but it has 3 options"):
        solve_with("scipy", k_best_table(), exclude=[{"a": 7, "b": 0, "c": 0}])


def test_the_traced_unet_with_a_binding_memory_limit() -> None:
    from conftest import build_model

    from calibrate.presets import preset_cluster, preset_profile
    from cost_models.ir.tracing import trace
    from planner.space import build_space

    graph = trace(build_model("unet"), (2, 3, 64, 64))
    cluster = preset_cluster("a100", 2)
    table = build_space(graph, preset_profile("a100"), cluster, 2, memory_limit_bytes=cluster.memory_bytes).table
    free = solve_with("scipy", table)
    least = sum(min(table.memory_bytes[layer]) for layer in table.layers if layer in table.memory_bytes)
    tight = replace(table, memory_limit_bytes=(least + table.memory(free.choice)) // 2)
    for case in (table, tight):
        results = {backend: solve_with(backend, case) for backend in backends()}
        for backend, found in results.items():
            assert case.fits(found.choice) and found.status == "Optimal", backend
        assert results["scipy"].objective_s == pytest.approx(
            results.get("pulp", results["scipy"]).objective_s, rel=1e-9, abs=1e-12)
    assert solve_with("scipy", tight).objective_s >= free.objective_s - 1e-12


def test_without_pulp_the_module_imports_and_solves_with_scipy() -> None:
    code = ("import sys; sys.modules['pulp'] = None\n"
            "import planner.solvers.ilp as ilp\n"
            "from planner.solvers.cost_table import CostTable\n"
            "assert ilp.BACKEND == 'scipy' and ilp.available_solvers() == ['cbc', 'highs']\n"
            "t = CostTable(('a', 'b'), {'a': ('x', 'y'), 'b': ('x', 'y')}, {'a': (1.0, 3.0), 'b': (1.0, 0.5)},\n"
            "              {('a', 'b'): ((0.0, 5.0), (5.0, 0.0))})\n"
            "s = ilp.solve_ilp(t)\n"
            "assert (s.choice, s.objective_s, s.solver) == ({'a': 0, 'b': 0}, 2.0, 'scipy-highs'), s\n"
            "assert 'torch' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
