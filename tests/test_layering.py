"""Tier 1: the one-way street of DESIGN.md — every arrow, no private names across modules, planner without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_parplan_planner_and_vocabulary_import_without_torch() -> None:
    code = (
        "import sys, planner, parplan, parplan.cli, parplan.cli.report, parplan.cli.main, cost_models, cost_models.plan, cost_models.layout, "
        "cost_models.graph, cost_models.flops, cost_models.cluster\n"
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


OURS = ("parplan", "calibrate", "planner", "runtime", "cost_models")
ALLOWED = {  # DESIGN.md's picture: parplan on top, the three rooms on cost_models, cost_models on nothing of ours
    "parplan": {"calibrate", "planner", "runtime", "cost_models"},
    "calibrate": {"cost_models"},
    "planner": {"cost_models"},
    "runtime": {"cost_models"},
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
