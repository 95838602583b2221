"""The service fuzzed over its own OpenAPI schema (schemathesis, every check): the short version of
``make fuzz`` (``eval/fuzz_api.py``), 100 fuzzing cases per operation against the fake models."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval"))

from fuzz_api import run


@pytest.mark.slow  # 100 cases per operation over the whole app
def test_schemathesis_finds_nothing(tmp_path):
    code, result = run(cases=100, seed=1, workers=1, real=False, log_path=str(tmp_path / "server.log"))
    assert result.get("failures") == [] and result.get("errors") == [], result["stdout_tail"]
    assert code == 0, result["stdout_tail"]
    for operation in (
        "POST /v1/embeddings",
        "POST /v1/rerank",
        "POST /v2/embed",
        "POST /embed",
        "POST /rerank",
        "POST /",
    ):
        phases = result["per_operation"][operation]
        assert phases["fuzzing/positive"] + phases["fuzzing/negative"] >= 100, (operation, phases)
        assert phases["coverage/negative"] > 0 and phases["fuzzing/negative"] > 0, (operation, phases)
