"""The pgvector benchmark (``eval/benchmarks/pgvector.py``) runs on a small store: PostgreSQL with pgvector from the
``pgserver`` wheel starts, the exact scan in the database finds what the in-memory exact search finds, and both
HNSW indexes find most of it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # starts a PostgreSQL server
def test_the_pgvector_benchmark_runs_and_its_exact_scan_agrees():
    done = subprocess.run(
        [sys.executable, "-m", "eval", "bench", "pgvector", "--sizes", "1500", "--queries", "12"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        name: float(recall)
        for name, recall in re.findall(
            r"^\| 1,500 \| ([a-zA-Z ]+) \| [\d.]+ \| [\d.]+ \| [\d.]* \| ([\d.]+) \|", done.stdout, re.M
        )
    }
    assert rows.keys() == {"pgvector exact", "in memory exact", "pgvector HNSW", "in memory HNSW"}, done.stdout
    assert rows["pgvector exact"] >= 0.99 and rows["in memory exact"] == 1.0
    assert rows["pgvector HNSW"] >= 0.8 and rows["in memory HNSW"] >= 0.8
    assert re.search(r"^PostgreSQL 16\.\d+, pgvector 0\.6\.2", done.stdout, re.M), done.stdout
