"""``import embedrank`` bounds libgomp's idle spinning before torch loads (:mod:`embedrank.openmp`), the
service's entry point imports it before torch, a setting the user made is kept, and the package's own modules
load torch only when a model is used."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHOW = "import os, sys; {imports}; print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)"


def spin_after(imports: str, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run(
        [sys.executable, "-c", SHOW.format(imports=imports)],
        env={**clean, "HF_HUB_OFFLINE": "1", **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


@pytest.mark.slow  # a fresh interpreter each
@pytest.mark.parametrize(
    "imports", ["import embedrank; embedrank.Encoder", "import app"], ids=["package", "service-entry"]
)
def test_bounded_before_torch_loads(imports):
    assert spin_after(imports) == ["10000", "True"]  # torch loaded after the bound was set


@pytest.mark.slow
def test_user_settings_and_late_imports_are_left_alone():
    assert spin_after("import embedrank; embedrank.Encoder", GOMP_SPINCOUNT="300000") == ["300000", "True"]
    assert spin_after("import embedrank; embedrank.Encoder", OMP_WAIT_POLICY="PASSIVE") == ["None", "True"]
    assert spin_after("import torch; import embedrank") == ["None", "True"]  # too late: libgomp has read it


@pytest.mark.slow
def test_the_package_and_its_file_readers_load_no_torch():
    """The API's names are imported on first use: a process that only reads files (the service's file readers)
    or only needs the errors does not load torch."""
    assert spin_after("import embedrank, embedrank.retrieval.documents, embedrank.errors")[1] == "False"
