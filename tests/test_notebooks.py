"""Every notebook runs top to bottom (quick mode) through nbclient."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))

pytestmark = [pytest.mark.notebooks, pytest.mark.slow]


def test_all_five_notebooks_exist():
    assert [p.stem for p in NOTEBOOKS] == [
        "01_quickstart",
        "02_retrieve_then_rerank",
        "03_evaluation",
        "04_index_tradeoffs",
        "05_service",
    ]
    for nb in NOTEBOOKS:
        assert nb.with_suffix(".py").is_file(), f"{nb.name} has no jupytext-paired .py"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, data_dir):
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    assert any(o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])), "committed without outputs"
    env_before = dict(os.environ)
    os.environ.update({"EMBEDRANK_NOTEBOOK_QUICK": "1", "EMBEDRANK_DATA": str(data_dir), "MPLBACKEND": "Agg"})
    try:
        NotebookClient(
            nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
        ).execute()
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
