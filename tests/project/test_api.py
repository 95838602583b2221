"""The stable public API: everything a notebook needs is importable from the top level, and the layers
import only downwards."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import embedrank

pytestmark = pytest.mark.kernel_free

ROOT = Path(embedrank.__file__).resolve().parent


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


def test_the_names_imported_on_first_use_are_those_type_checkers_see():
    """``embedrank._LAZY`` (where ``__getattr__`` finds a name) and the ``TYPE_CHECKING`` imports list the same
    names from the same modules, and with the eager imports they are ``__all__``."""
    tree = ast.parse((ROOT / "__init__.py").read_text(encoding="utf-8"))
    (guarded,) = [n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING"]
    typed = {a.name: node.module for node in guarded.body if isinstance(node, ast.ImportFrom) for a in node.names}
    assert typed == embedrank._LAZY
    eager = {a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module != "importlib" for a in n.names}
    assert eager - {"TYPE_CHECKING", "Any"} | set(typed) == set(embedrank.__all__)
    assert set(embedrank.__all__) <= set(dir(embedrank))


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("embedrank."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("embedrank."))
    return found


# The layers, bottom first; each may import the base modules and the layers listed for it, nothing else.
BASE = {"errors", "types", "paths", "openmp"}  # openmp: imported first of all, before torch loads
LAYER_IMPORTS: dict[str, set[str]] = {
    "math": set(),
    "texts": set(),  # text sources: files, the packaged sample, seeded vocabulary sentences
    "bundled": set(),  # weights another package ships, found by its files and checked by hash
    "hub": set(),  # what to download of a hub model, and where the hub cache has it
    "registry": {"math", "bundled", "hub"},  # a model id -> a local folder and its ModelSpec
    "runtime": {"math", "texts", "registry"},  # what runs the transformer: torch, OpenVINO, ONNX Runtime
    "models": {"math", "texts", "registry", "runtime"},  # encoders, cross-encoders, scorers
    "testing": {"math", "texts", "registry", "runtime", "models"},  # fakes, seeded models, server launcher
    "retrieval": {"math", "registry", "runtime", "models"},
    "evaluation": {"math", "registry", "runtime", "models", "retrieval"},
    "training": {"math", "registry", "runtime", "models", "retrieval", "evaluation"},
    # hosting, pools (fakes for fast tests), engines; document stores searched with retrieval's first stages
    "serving": {"math", "registry", "runtime", "models", "testing", "retrieval"},
    "embed": {"models", "retrieval"},  # python -m embedrank.embed
}


def test_layers_import_only_downwards():
    for layer, below in LAYER_IMPORTS.items():
        paths = [ROOT / f"{layer}.py"] if (ROOT / f"{layer}.py").is_file() else list((ROOT / layer).glob("*.py"))
        assert paths, layer
        for path in paths:
            bad = _imports(path) - below - BASE - {layer}
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)} from above or beside its layer"
    for name in BASE:
        assert _imports(ROOT / f"{name}.py") <= BASE
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    modules = {p.stem for p in ROOT.glob("*.py")} - {"__init__"}
    assert packages | modules == set(LAYER_IMPORTS) | BASE  # every module has its place in the table


def _module_graph() -> dict[str, set[str]]:
    """Every module of ``embedrank`` and ``service`` -> the modules of both it imports: at the top, under
    ``TYPE_CHECKING`` and inside functions alike (a lazy import still closes a circle)."""
    repo = ROOT.parent
    paths = {}
    for package in ("embedrank", "service"):
        for path in (repo / package).rglob("*.py"):
            name = ".".join(path.relative_to(repo).with_suffix("").parts).removesuffix(".__init__")
            paths[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        named = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                named |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                named |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        targets = set()
        for target in named:
            while target and target not in paths:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_anywhere():
    """No module imports, however indirectly, a module that imports it: within a package as between layers."""
    assert _circles(_module_graph()) == []


def test_no_code_is_packed_past_the_formatter():
    """``# fmt: skip`` kept code on lines the formatter would split; a module's size follows its concern."""
    for package in ("embedrank", "service"):
        for path in (ROOT.parent / package).rglob("*.py"):
            assert "fmt: skip" not in path.read_text(encoding="utf-8"), path


def test_the_service_imports_only_the_serving_layer_of_the_core():
    """The service is an adapter over hosting: it imports the core's serving layer, errors, result and option
    types, the core's environment names (to refuse unknown EMBEDRANK_ variables) and the package version; never
    the core's test doubles (the pool itself serves a configuration's ``fake:`` models)."""
    allowed = {"serving", "retrieval", "errors", "types", "paths"}
    service = ROOT.parent / "service"
    for path in sorted(service.rglob("*.py")):
        assert _imports(path) <= allowed, f"service/{path.name} imports {sorted(_imports(path) - allowed)}"


DOMAINS = {"files": {"storage"}, "batches": {"storage", "files"}, "vector_stores": {"storage", "files"}}
"""The service's domain packages and the packages of the service each stands on: files, batches and vector
stores over one storage; batches and vector stores over the files they read."""


def _service_package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "service" else None


def test_no_domain_imports_another_and_storage_imports_none():
    """Batches and vector stores are peers: neither imports the other; both take the file store and the storage;
    the storage knows no domain; of the service's shared modules only those that compose the domains import one:
    the app, the route table, and a replica's engine process (which runs the batch jobs and reads the files)."""
    graph = _module_graph()
    packages = set(DOMAINS) | {"storage"}
    for module, targets in graph.items():
        mine = _service_package(module)
        reached = {package for package in map(_service_package, targets) if package in packages} - {mine}
        if mine in DOMAINS:
            assert reached <= DOMAINS[mine], f"{module} imports {sorted(reached - DOMAINS[mine])}"
        elif mine == "storage":
            assert not reached, f"{module} imports {sorted(reached)}"
        elif module.startswith("service.") and module not in (
            "service.app",
            "service.routes",
            "service.replica.engine",
        ):
            assert not (reached - {"storage"}), f"{module} imports the domain {sorted(reached)}"
    assert {_service_package(m) for m in graph} >= packages
