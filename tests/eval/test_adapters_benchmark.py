"""The task-adapter benchmark (``eval/benchmarks/adapters.py``) runs small: every system timed in every round, the
medians against the bare base, and the memory of each way of loading the adapters."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # processes of its own


def test_the_adapter_benchmark_times_every_system_and_measures_memory():
    command = [sys.executable, "-m", "eval", "bench", "adapters", "--passages", "24", "--rounds", "1"]
    command += ["--adapters", "2", "--rank", "4", "--backends", "torch"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    medians = re.findall(r"^  (base|one adapter|mixed|merged models) +[\d.]+ texts/s +([\d.]+)x$", done.stdout, re.M)
    assert [name for name, _ in medians] == ["base", "one adapter", "mixed", "merged models"], done.stdout
    assert medians[0][1] == "1.00"
    assert re.search(
        r"^  torch +base \d+ MiB; base \+ 2 adapters \d+ MiB \(\+-?\d+\); 2 merged models \d+ MiB", done.stdout, re.M
    ), done.stdout
