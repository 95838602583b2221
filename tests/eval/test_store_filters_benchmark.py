"""The filtered-search benchmark (``eval/benchmarks/store_filters.py``) runs on a small store: every stage measured
with and without the filter, and every filtered result one the filter allows (the script asserts it)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # a process of its own


def test_the_filtered_search_benchmark_measures_every_stage_both_ways():
    done = subprocess.run(
        [sys.executable, "-m", "eval", "bench", "store-filters", "--chunks", "3000", "--queries", "12"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    stages = re.findall(r"^\| (dense|bm25|hybrid) \| (?:[\d.]+ \| ){4}[\d.]+x \|$", done.stdout, re.M)
    assert stages == ["dense", "bm25", "hybrid"], done.stdout
    assert re.search(r"^3,000 chunks \([\d,]+ pass the filter, \d+%\)", done.stdout, re.M), done.stdout
