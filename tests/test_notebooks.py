"""Notebooks run headless on the bundled traces (a notebook that errors fails CI), and each
.ipynb matches its jupytext script (the script is what diffs are read on)."""

from __future__ import annotations

from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.py"))


@pytest.mark.parametrize("script", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(script, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    nb = jupytext.read(script)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in outputs), "no figure drawn"


@pytest.mark.parametrize("script", NOTEBOOKS, ids=lambda p: p.stem)
def test_ipynb_is_paired_with_its_script(script):
    paired = script.with_suffix(".ipynb")
    assert paired.exists(), f"run `jupytext --to ipynb {script.name}`"
    a = [(c.cell_type, c.source) for c in jupytext.read(script).cells]
    b = [(c.cell_type, c.source) for c in nbformat.read(paired, as_version=4).cells]
    assert a == b, f"{paired.name} is out of date: run `jupytext --sync {script.name}`"
