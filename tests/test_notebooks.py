"""Notebooks run headless on the bundled traces (a notebook that errors fails CI), and each
.ipynb matches its jupytext script (the script is what diffs are read on) and carries the
outputs of a run, so it reads without running. `python tests/test_notebooks.py --write`
(`make notebooks`) executes the scripts and writes the .ipynb files with their outputs."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.py"))
#: A committed notebook stays small enough to review and to render on a code host.
MAX_BYTES = 3_000_000
#: Absolute paths of the machine that ran it must not end up in the outputs.
MACHINE_PATHS = (str(Path(__file__).resolve().parents[1]), str(Path.home()), tempfile.gettempdir(), "site-packages")


def execute(script: Path, folder: Path):
    nb = jupytext.read(script)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    for cell in nb.cells:  # what varies from run to run
        cell.metadata.pop("execution", None)
    return nb


@pytest.mark.parametrize("script", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(script, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    nb = execute(script, tmp_path)
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


@pytest.mark.parametrize("script", NOTEBOOKS, ids=lambda p: p.stem)
def test_ipynb_carries_the_outputs_of_a_run(script):
    paired = script.with_suffix(".ipynb")
    nb = nbformat.read(paired, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and "parameters" not in c.metadata.get("tags", [])]
    assert all(c.get("execution_count") for c in code), f"{paired.name} has cells never run: `make notebooks`"
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in outputs)
    assert paired.stat().st_size < MAX_BYTES, f"{paired.name} is {paired.stat().st_size:,} bytes"
    text = json.dumps(outputs)
    assert not [p for p in MACHINE_PATHS if p in text], [p for p in MACHINE_PATHS if p in text]
    assert "plotly.min.js" not in text or "cdn" in text, "plotly.js must not be inlined in a committed notebook"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    with tempfile.TemporaryDirectory() as folder:
        os.environ["XDG_CACHE_HOME"] = str(Path(folder) / "cache")
        for script in NOTEBOOKS:
            nb = execute(script, Path(folder))
            jupytext.write(nb, script.with_suffix(".ipynb"))
            print(f"wrote {script.with_suffix('.ipynb').name}: {script.with_suffix('.ipynb').stat().st_size:,} bytes")
