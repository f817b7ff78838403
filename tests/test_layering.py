"""Tier 1: the one-way street of docs/architecture.md — every arrow, no import circles, no private names across
modules, planner without torch, no process started by a cost model."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_parplan_planner_and_vocabulary_import_without_torch() -> None:
    code = (
        "import sys, planner, parplan, parplan.cli, parplan.cli.report, parplan.cli.main, cost_models, cost_models.formats.plan, "
        "cost_models.layout, cost_models.ir.graph, cost_models.ir.kinds, cost_models.ir.flops, cost_models.cluster, "
        "cost_models.capability.predicate, planner.search, planner.pipeline.stages\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not bad, bad[:5]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


OURS = ("parplan", "calibrate", "planner", "runtime", "processes", "cost_models")
ALLOWED = {  # docs/architecture.md's picture: parplan on top; calibrate runs the runtime's forms (never the planner);
    # the runtime never chooses a plan (no planner); cost models start no process (no processes)
    "parplan": {"calibrate", "planner", "runtime", "processes", "cost_models"},
    "calibrate": {"runtime", "processes", "cost_models"},
    "planner": {"cost_models"},
    "runtime": {"processes", "cost_models"},
    "processes": {"cost_models"},
    "cost_models": set(),
}


def _our_imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every absolute import of our packages in ``path`` (names empty for ``import m``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names if alias.name.split(".")[0] in OURS]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] in OURS:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def _sources(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize("package", OURS)
def test_imports_go_one_way(package: str) -> None:
    for path in _sources(package):
        for module, _ in _our_imports(path):
            target = module.split(".")[0]
            assert target == package or target in ALLOWED[package], \
                f"{path.relative_to(REPO)} imports {module}: {package} may import only {sorted(ALLOWED[package])}"


@pytest.mark.parametrize("package", OURS)
def test_no_module_imports_another_modules_private_name(package: str) -> None:
    """A private module (``runtime._values``) serves its own package; a private name only its own module."""
    for path in _sources(package):
        here = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for module, names in _our_imports(path):
            private_module = any(part.startswith("_") and part != "__init__" for part in module.split("."))
            assert not (private_module and module.split(".")[0] != package), \
                f"{path.relative_to(REPO)} imports {module}, private to {module.split('.')[0]}"
            private_names = [name for name in names if name.startswith("_") and module != here]
            assert not private_names, f"{path.relative_to(REPO)} imports {private_names} from {module}"


def test_the_layering_test_sees_a_wrong_arrow(tmp_path: Path) -> None:
    """The checks above read imports the way a wrong one would be written."""
    source = tmp_path / "bad.py"
    source.write_text("from planner.search import _memo_for\nimport runtime.apply\n")
    assert _our_imports(source) == [("planner.search", ["_memo_for"]), ("runtime.apply", [])]


def test_planner_never_imports_torch() -> None:
    for path in _sources("planner"):
        assert "torch" not in _imports(path), f"{path.relative_to(REPO)} imports torch"


def test_cost_models_start_no_process() -> None:
    for path in _sources("cost_models"):
        started = _imports(path) & {"subprocess", "multiprocessing", "torch"} - {"torch"}
        assert not started, f"{path.relative_to(REPO)} imports {sorted(started)}: cost models start no process"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (they run for the type checker only)."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return hidden


def _import_graph() -> dict[str, set[str]]:
    """Module → the modules of ours it imports, at the top or inside a function (``if TYPE_CHECKING:`` aside);
    ``from package import module`` names the module, ``from module import name`` the module."""
    paths = {_module_name(path): path for package in OURS for path in _sources(package)}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        tree = ast.parse(path.read_text())
        hidden = _type_checking_only(tree)
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            if isinstance(node, ast.Import):
                graph[name].update(alias.name for alias in node.names if alias.name in paths)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in paths:
                inner = {f"{node.module}.{alias.name}" for alias in node.names} & set(paths)
                graph[name].update(inner or {node.module})
                if len(inner) < len(node.names):
                    graph[name].add(node.module)
    return graph


def test_no_import_circles() -> None:
    """No module reaches itself through imports — those inside functions count, ``if TYPE_CHECKING:`` ones not."""
    import networkx as nx

    graph = nx.DiGraph([(module, target) for module, targets in _import_graph().items() for target in targets
                        if target != module])
    circles = [sorted(component) for component in nx.strongly_connected_components(graph) if len(component) > 1]
    assert not circles, f"import circles: {circles}"


def test_the_circle_test_sees_a_circle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A function-level import closing a loop is a circle; one under ``if TYPE_CHECKING:`` is not."""
    for package in ("alpha", "beta"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "alpha" / "one.py").write_text("from beta.two import f\n")
    (tmp_path / "beta" / "two.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from alpha.one import g\n"
        "def f():\n    from alpha import one\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "OURS", ("alpha", "beta"))
    assert _import_graph()["beta.two"] == {"alpha.one"}
    (tmp_path / "beta" / "two.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                              "    from alpha.one import g\n")
    assert _import_graph()["beta.two"] == set()
