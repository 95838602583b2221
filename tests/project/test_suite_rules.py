"""The suite's own rules, which decide what a clone without the benchmark collections sees and what the pass held
to AVX2 runs: the ``data`` mark (the collections for marked tests only, a skip without them) and the
``kernel_free`` mark (left out of ``make test-avx2``, so no model may compute in such a test)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from embedrank.errors import DataNotFoundError
from embedrank.retrieval.data import load_beir

REPO = Path(__file__).resolve().parents[2]


def _conftest(request):
    """The suite's conftest module, as pytest loaded it (importing it again would run it again)."""
    (module,) = [
        p
        for p in request.config.pluginmanager.get_plugins()
        if getattr(p, "__file__", "") == str(REPO / "tests" / "conftest.py")
    ]
    return module


def _item(*marks, fixtures=()):
    by_name = {m.name: m for m in marks}
    return SimpleNamespace(nodeid="tests/x.py::t", fixturenames=list(fixtures), get_closest_marker=by_name.get)


@pytest.mark.kernel_free
def test_a_test_without_the_data_mark_sees_an_empty_data_directory(request):
    assert os.environ["EMBEDRANK_DATA"] == _conftest(request).NO_DATA and not os.listdir(os.environ["EMBEDRANK_DATA"])
    with pytest.raises(DataNotFoundError):
        load_beir("scifact")


@pytest.mark.kernel_free
def test_asking_for_the_collections_without_the_mark_fails_and_a_missing_collection_skips(request, monkeypatch):
    conftest = _conftest(request)
    with pytest.raises(pytest.fail.Exception, match="reads the benchmark collections: mark it data"):
        conftest.pytest_runtest_setup(_item(fixtures=["tmp_path", "data_dir"]))
    conftest.pytest_runtest_setup(_item(fixtures=["tmp_path"]))  # no collections asked for: nothing happens
    monkeypatch.setattr(conftest, "SHARED_DATA", Path("/nonexistent"))
    with pytest.raises(pytest.skip.Exception, match=r"needs adi, cranfield in the data directory"):
        conftest.pytest_runtest_setup(_item(pytest.mark.data("adi", "cranfield").mark))
    with pytest.raises(pytest.skip.Exception, match=r"needs scifact in the data directory"):
        conftest.pytest_runtest_setup(_item(pytest.mark.data.mark))
    assert os.environ["EMBEDRANK_DATA"] == conftest.NO_DATA  # a skipped test gets no collections either


@pytest.mark.data("adi")
def test_a_marked_test_reads_its_collections():
    assert len(load_beir("adi").corpus) == 82


@pytest.mark.kernel_free
def test_a_kernel_free_test_cannot_run_a_model():
    import onnxruntime
    import openvino
    import torch

    refused = "may not be marked kernel_free"
    with pytest.raises(AssertionError, match=refused):
        torch.nn.Linear(2, 2)(torch.zeros(1, 2))
    with pytest.raises(AssertionError, match=refused):
        openvino.Core().compile_model("model.xml", "CPU")
    with pytest.raises(AssertionError, match=refused):
        onnxruntime.InferenceSession(b"not a model")


@pytest.mark.slow
@pytest.mark.kernel_free
def test_a_kernel_free_test_starts_only_servers_of_fakes():
    with pytest.raises(AssertionError, match="may not be marked kernel_free"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)  # a script: it may load a model
    with pytest.raises(AssertionError, match="may not be marked kernel_free"):
        subprocess.run([sys.executable, "-c", "pass"], env={**os.environ, "EMBEDRANK_MODELS": "m=fake:encoder,real"})
    fakes = {**os.environ, "EMBEDRANK_MODELS": "a=fake:encoder,b=fake:cross-encoder@torch"}
    assert subprocess.run([sys.executable, "-c", "pass"], env=fakes).returncode == 0
    assert subprocess.run(["true"]).returncode == 0  # not Python: PostgreSQL's programs, for one


def test_the_pass_held_to_avx2_is_chosen_by_layer_and_mark(request):
    """The pass runs the layers that compute by their folders (a new test of a runtime is in it unless marked
    kernel_free) and, above them, the tests marked kernels; every folder of tests is in one list or the other, and
    CI runs the README's test command first."""
    conftest = _conftest(request)
    folders = {f"tests/{p.name}/" for p in (REPO / "tests").iterdir() if p.is_dir() and any(p.rglob("test_*.py"))}
    packages = {f"{name}/" for name in ("embedrank", "service")}  # their doctests
    assert folders | packages == {*conftest.COMPUTING, *conftest.ABOVE} - {"tests/conftest.py"}
    assert not set(conftest.COMPUTING) & set(conftest.ABOVE)
    with pytest.raises(ValueError, match="say which it is"):
        conftest.in_kernel_pass("tests/new_layer/test_x.py::t", set())
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^test-avx2:.*\n\t(.*)$", makefile, re.M)
    assert recipe and recipe.group(1).endswith('$(PYTEST) -m "not extended" --kernel-pass'), recipe
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert [line for line in lines if line.startswith("make ")][:2] == ["make test", "make test-avx2"]
    assert "make test " in (REPO / "README.md").read_text(encoding="utf-8")


@pytest.mark.slow  # a pytest of its own, collecting only
def test_the_pass_held_to_avx2_selects_what_the_rule_says():
    """Collected with --kernel-pass, a computing layer's test stays, a service test goes unless marked kernels, and
    a kernel_free test goes wherever it is."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--co",
            "-q",
            "--kernel-pass",
            "-p",
            "no:cacheprovider",
            "tests/serving/test_scheduler.py",
            "tests/math/test_quantization.py",
            "tests/service/test_service_real.py",
            "tests/service/test_service_process.py",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    chosen = {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}
    assert {"tests/service/test_service_real.py", "tests/math/test_quantization.py"} <= chosen
    assert "tests/service/test_service_process.py" not in chosen  # above the models, not marked kernels
    assert "tests/serving/test_scheduler.py" not in chosen  # kernel_free
