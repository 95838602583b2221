"""Every notebook runs top to bottom (quick mode) through nbclient, and every cell that draws a figure
carries it as an image, both in the committed notebook (what a reader sees on a code host) and when run."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
DRAWS = re.compile(r"\bplt\.(subplots|figure|plot|bar|scatter|hist)\(|\.plot\(")


def _figure_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and DRAWS.search(c.source)]


def _has_image(cell) -> bool:
    return any(
        "image/png" in o.get("data", {}) or "image/svg+xml" in o.get("data", {}) for o in cell.get("outputs", [])
    )


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
def test_committed_notebook_carries_its_outputs_and_figures(path):
    nb = nbformat.read(path, as_version=4)
    assert any(o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])), "committed without outputs"
    missing = [c.source.splitlines()[0] for c in _figure_cells(nb) if not _has_image(c)]
    assert not missing, f"{path.name}: cells that draw a figure were committed without it: {missing}"
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name} was committed with an error output"


def _reads_collections(path) -> bool:
    return bool(re.search(r"load_beir|scifact|EMBEDRANK_DATA", path.with_suffix(".py").read_text(encoding="utf-8")))


@pytest.mark.notebooks
@pytest.mark.slow
@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=[pytest.mark.data] if _reads_collections(p) else [], id=p.stem) for p in NOTEBOOKS],
)
def test_notebook_runs_and_draws_its_figures(path, request):
    from eval.execute_notebooks import run_notebook  # the the same run as `make notebooks`, in quick mode

    env = {"EMBEDRANK_NOTEBOOK_QUICK": "1"}
    if _reads_collections(
        path
    ):  # on SciFact's judged sample (its vectors in the embedding cache, as after a first run)
        request.getfixturevalue("scifact_sample_dense")
        env["EMBEDRANK_DATA"] = str(request.getfixturevalue("sample_data_dir"))
    nb = run_notebook(path, env, timeout=600)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    missing = [c.source.splitlines()[0] for c in _figure_cells(nb) if not _has_image(c)]
    assert not missing, f"{path.name}: cells that draw a figure produced none: {missing}"
