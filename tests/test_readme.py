"""Every ```python block of the README runs, in order, in one namespace (as Litestar tests its docs examples)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.S | re.M)

pytestmark = [pytest.mark.slow, pytest.mark.data]


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 2


def test_readme_python_blocks_run(scifact_dense, cross_encoder_dir, monkeypatch, tmp_path, capsys):
    # the SciFact corpus vectors are in the default embedding cache (scifact_dense), as after a first run
    monkeypatch.setenv("EMBEDRANK_CROSS_ENCODER", cross_encoder_dir)  # offline stand-in for the hub model
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme"}
    for number, block in enumerate(BLOCKS, start=1):
        exec(compile(block, f"README.md python block {number}", "exec"), namespace)
    printed = capsys.readouterr().out
    assert "embedding cache: hit (" in printed
    assert "'ndcg@10'" in printed and "'recall@100'" in printed
