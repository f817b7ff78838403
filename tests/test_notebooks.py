"""The notebooks execute from top to bottom (nbclient, a fresh kernel each) — they call the package and need no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_there() -> None:
    assert {path.name for path in NOTEBOOKS} >= {"whatif.ipynb", "calibration.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_runs(path: Path) -> None:
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [output for cell in notebook.cells for output in cell.get("outputs", []) if output.get("output_type") == "error"]
    assert not errors
    assert any(output.get("output_type") in ("stream", "display_data", "execute_result")
               for cell in notebook.cells for output in cell.get("outputs", []))
