"""The comparison of systems through the command line: several systems on a collection, per-metric tables with
significance, the JSON layout, stable run file names, and ``--compare`` on existing run files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _cli(*args, cwd):
    cmd = [sys.executable, str(ROOT / "eval" / "run.py"), *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_several_systems_then_compare_their_run_files(tmp_path):
    from embedrank.retrieval.data import write_demo_collection

    collection = write_demo_collection(tmp_path / "data")
    name = Path(collection).name
    common = ["--run-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "cache"), "--permutations", "500"]
    out = _cli(
        str(collection), "--retriever", "bm25", "dense", "--json-out", str(tmp_path / "r.json"), *common, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "ndcg@10  (†: differs from bm25" in out.stdout and "against bm25:" in out.stdout
    payload = json.loads((tmp_path / "r.json").read_text())
    assert [r["system"] for r in payload["runs"]] == ["bm25", "dense"] and payload["baseline"] == "bm25"
    per_query = payload["runs"][1]["per_query"]
    assert set(per_query) == {"ndcg@10", "recall@100", "mrr@10"} and len(per_query["ndcg@10"]) == 6
    assert len(payload["comparisons"]) == 3  # dense vs bm25, three metrics
    c = payload["comparisons"][0]
    assert {c["dataset"], c["system"], c["baseline"], c["metric"]} == {name, "dense", "bm25", "ndcg@10"}
    assert {"t_test_p", "randomization_p", "p_holm", "significant", "wins", "ties", "losses"} <= set(c)
    files = sorted(p.name for p in (tmp_path / "runs" / name).glob("*.trec"))
    assert files == ["bm25.trec", "dense.trec"]

    again = _cli(
        str(collection),
        "--compare",
        *(str(tmp_path / "runs" / name / f) for f in files),
        "--baseline",
        "dense",
        "--json-out",
        str(tmp_path / "c.json"),
        *common,
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr
    compared = json.loads((tmp_path / "c.json").read_text())
    assert compared["comparisons"][0]["system"] == "bm25" and compared["baseline"] == "dense"
    # the same per-query scores from the run files as from the runs themselves
    assert compared["runs"][1]["per_query"] == payload["runs"][1]["per_query"]


def test_bad_metric_and_compare_without_one_dataset_are_clear_errors(tmp_path):
    out = _cli("--metrics", "ndcg@7", cwd=tmp_path)
    assert out.returncode == 2 and "cut-offs" in out.stderr and "Traceback" not in out.stderr
    out = _cli("--compare", "x.trec", cwd=tmp_path)
    assert out.returncode == 2 and "exactly one dataset" in out.stderr
