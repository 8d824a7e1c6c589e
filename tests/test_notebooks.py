"""The notebooks run end to end (short mode) and are up to date with their builder."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_notebooks_exist():
    assert {p.name for p in NOTEBOOKS} >= {"capacity_study.ipynb", "paper_figures.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes_in_short_mode(path, monkeypatch):
    monkeypatch.setenv("SCEPSY_NOTEBOOK_SHORT", "1")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors


def test_notebooks_match_their_builder(tmp_path):
    subprocess.run([sys.executable, str(REPO / "notebooks" / "build_notebooks.py"), str(tmp_path)], check=True, capture_output=True)
    built = {p.name: p.read_text() for p in sorted(tmp_path.glob("*.ipynb"))}
    assert built == {p.name: p.read_text() for p in NOTEBOOKS}, "run python notebooks/build_notebooks.py and commit"
