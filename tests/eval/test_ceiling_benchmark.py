"""The service's ceiling benchmark (``eval/benchmarks/ceiling.py``) runs briefly: a served zero-cost model answers
every request, and each case reports texts/s, the server's CPU per request by process and the engine alone's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # starts a server


def test_the_ceiling_benchmark_serves_the_zero_cost_model_and_reports_each_process():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "eval",
            "bench",
            "ceiling",
            "--clients",
            "2",
            "--seconds-per-case",
            "1",
            "--rounds",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    head = next(line for line in done.stdout.splitlines() if line.startswith("| server |"))
    assert "CPU ms/request: server" in head and "CPU ms/request: client" in head, head
    rows = re.findall(r"^\| single \| (1 query|16 passage) \| 2 \| ([\d,.]+) \|", done.stdout, re.M)
    assert [kind for kind, _ in rows] == ["1 query", "16 passage"], done.stdout
    assert all(float(rate.replace(",", "")) > 0 for _, rate in rows)
