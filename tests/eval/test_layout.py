"""``eval/`` is a package by concern: a harness the benchmarks share, benchmarks that import no other benchmark and
are each named in the registry, quality and fuzzing apart; nothing edits ``sys.path``; and ``tests/`` holds its
tests in folders by layer."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from eval.__main__ import main
from eval.benchmarks import REGISTRY

pytestmark = pytest.mark.kernel_free

REPO = Path(__file__).resolve().parents[2]
EVAL = REPO / "eval"


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top and inside functions alike."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_nothing_edits_sys_path():
    for path in [*EVAL.rglob("*.py"), *(REPO / "tests").rglob("*.py")]:
        if path == Path(__file__):
            continue
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"sys\.path\.(insert|append)|syspath_prepend", text), path.relative_to(REPO)


def test_no_benchmark_imports_another():
    modules = sorted((EVAL / "benchmarks").glob("*.py"))
    assert len(modules) > 20
    for path in modules:
        others = {m for m in _imported(path) if m.startswith("eval.benchmarks")}
        assert not others, f"{path.relative_to(REPO)} imports {sorted(others)}: what both need belongs in eval/harness"
    for path in (EVAL / "harness").glob("*.py"):
        assert not {m for m in _imported(path) if m.startswith(("eval.benchmarks", "eval.quality", "eval.fuzz"))}


def test_every_benchmark_is_registered_and_every_record_has_its_entry_point():
    registered = {b.module for b in REGISTRY.values()}
    for path in (EVAL / "benchmarks").glob("*.py"):
        if path.stem != "__init__":
            assert f"eval.benchmarks.{path.stem}" in registered, f"{path.name} has no record in the registry"
    for benchmark in REGISTRY.values():
        path = REPO / (benchmark.module.replace(".", "/") + ".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert benchmark.entry in defined, f"{benchmark.name}: {path.relative_to(REPO)} has no {benchmark.entry}()"
        assert benchmark.title and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", benchmark.name)


def test_every_recorded_benchmark_is_rerun_by_its_name():
    """A record in eval/results made by a registered benchmark keeps its title: ``make bench NAME=...`` rewrites
    the same page section."""
    import json

    for path in (EVAL / "results").glob("*.json"):
        record = json.loads(path.read_text(encoding="utf-8"))
        if record["name"] in REGISTRY:
            assert record["title"] == REGISTRY[record["name"]].title, record["name"]


def test_the_make_targets_name_registered_benchmarks():
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    aliases = re.search(r"^BENCH_ALIASES := ((?:.*\\\n)*.*)$", makefile, flags=re.M)
    assert aliases
    named = set(aliases.group(1).replace("\\\n", " ").split())
    named |= set(re.findall(r"NAME=([a-z0-9-]+)", makefile))
    named |= set(re.findall(r"^\t\$\(RECORD\) ([a-z0-9-]+)$", makefile, flags=re.M))
    assert len(named) > 20 and named <= set(REGISTRY), sorted(named - set(REGISTRY))


def test_the_command_line_lists_and_refuses_an_unknown_name(capsys):
    assert main(["bench", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(re.search(rf"^{re.escape(name)} ", listed, flags=re.M) for name in REGISTRY)
    with pytest.raises(SystemExit, match="no benchmark named 'encod'"):
        main(["bench", "encod"])


def test_a_benchmark_runs_by_name_with_its_recorded_arguments_or_the_given_ones(monkeypatch):
    import importlib

    seen = []
    module = importlib.import_module("eval.benchmarks.store_filters")
    monkeypatch.setattr(module, "run", lambda argv: seen.append(argv) or 0)
    assert main(["bench", "store-filters"]) == 0
    assert main(["bench", "store-filters", "--chunks", "10"]) == 0
    assert seen == [list(REGISTRY["store-filters"].args), ["--chunks", "10"]]


def test_tests_live_in_folders_by_layer():
    assert not list((REPO / "tests").glob("test_*.py"))
