"""The stable public API: everything a notebook needs is importable from the top level, and the layers
import only downwards."""

from __future__ import annotations

import ast
from pathlib import Path

import embedrank

ROOT = Path(embedrank.__file__).resolve().parent
LAYERS = ["math", "models", "retrieval", "evaluation"]  # each may import those before it; serving sits on models


def test_notebook_names_are_top_level():
    names = {
        "Encoder",
        "CrossEncoder",
        "load_reranker",
        "similarity",
        "IndexConfig",
        "build_index",
        "load_index",
        "DenseRetriever",
        "BM25Retriever",
        "HybridRetriever",
        "RetrieveRerank",
        "load_beir",
        "evaluate",
        "evaluate_per_query",
        "ModelOutput",
    }
    assert names <= set(embedrank.__all__)
    for name in embedrank.__all__:
        assert getattr(embedrank, name) is not None


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("embedrank."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("embedrank."))
    return found


def test_layers_import_only_downwards():
    allowed = {"math": set(), "models": {"math"}, "retrieval": {"math", "models"}}
    allowed["evaluation"] = {"math", "models", "retrieval"}
    allowed["serving"] = {"math", "models"}
    allowed["training"] = {"math", "models", "retrieval", "evaluation"}
    base = {"errors", "types", "paths"}
    for package, below in allowed.items():
        for path in (ROOT / package).glob("*.py"):
            bad = _imports(path) - below - base - {package}
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)} from above or beside its layer"
    for path in (ROOT / "errors.py", ROOT / "types.py", ROOT / "paths.py"):
        assert _imports(path) <= base


def test_no_module_over_400_lines():
    for path in [*ROOT.rglob("*.py"), *(ROOT.parent / "service").glob("*.py")]:
        assert len(path.read_text(encoding="utf-8").splitlines()) <= 400, path
