"""Tier 1: the one-way street of DESIGN.md — planner needs no torch, cost_models imports nothing of ours."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_planner_and_vocabulary_import_without_torch() -> None:
    code = (
        "import sys, planner, planner.report, cost_models, cost_models.plan, cost_models.layout, "
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


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("cost_models", {"planner", "runtime", "calibrate"}),
        ("runtime", {"planner"}),
        ("calibrate", {"planner", "runtime"}),
    ],
)
def test_imports_go_one_way(package: str, forbidden: set[str]) -> None:
    for path in sorted((REPO / package).rglob("*.py")):
        assert not (_imports(path) & forbidden), f"{path.relative_to(REPO)} imports {_imports(path) & forbidden}"


def test_planner_outside_cli_never_imports_torch() -> None:
    for path in sorted((REPO / "planner").rglob("*.py")):
        if path.name != "cli.py":
            assert "torch" not in _imports(path), f"{path.relative_to(REPO)} imports torch"
