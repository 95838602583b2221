"""The service fuzzed over its own OpenAPI schema (schemathesis, every check): the short version of
``make fuzz`` (``eval/fuzz/api.py``), 30 fuzzing cases per operation (100 as an extended check) against the fake
models, then the edge cases schemathesis cannot send (numbers out of range, every integer field at and past its
bounds)."""

from __future__ import annotations

import json

import pytest

from eval.fuzz import edges as fuzz_edges
from eval.fuzz.api import run

pytestmark = pytest.mark.kernel_free


@pytest.mark.slow  # cases per operation over the whole app: 30 by default, 100 as an extended check
@pytest.mark.parametrize("cases", [30, pytest.param(100, marks=pytest.mark.extended)])
def test_schemathesis_finds_nothing(tmp_path, cases):
    code, result = run(cases=cases, seed=1, workers=1, real=False, log_path=str(tmp_path / "server.log"))
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
        assert phases["fuzzing/positive"] + phases["fuzzing/negative"] >= cases, (operation, phases)
        assert phases["coverage/negative"] > 0 and phases["fuzzing/negative"] > 0, (operation, phases)
    for operation in ("POST /v1/files", "POST /v1/batches", "GET /v1/batches/{batch_id}", "DELETE /v1/files/{file_id}"):
        assert sum(result["per_operation"][operation].values()) > 0, sorted(result["per_operation"])  # fuzzed too
    edges = result["edges"]
    assert edges["failures"] == [], edges["failures"][:10]
    assert edges["cases"] >= 400 and len(edges["operations"]) == 12, edges  # every POST operation got its edges
    assert edges["by_status"].get(200, 0) > 0 and edges["by_status"].get(400, 0) > 0, edges


def test_edge_cases_cover_every_integer_field_and_judge_answers():

    schema = {
        "paths": {
            "/e": {
                "post": {
                    "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/R"}}}}
                }
            }
        },
        "components": {
            "schemas": {
                "R": {
                    "properties": {
                        "input": {"type": "string"},
                        "chunking": {"type": "boolean"},
                        "chunk_overlap": {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "null"}]},
                    }
                }
            }
        },
    }
    cases = fuzz_edges.edges(schema, {"/e": [{"input": "x"}]})
    overlap = [
        json.loads(c.body.replace(b"1e400", b"0").replace(b"1e-400", b"0").replace(b"e9999", b""))
        for c in cases
        if c.field == "chunk_overlap"
    ]
    assert {o["chunk_overlap"] for o in overlap} >= {0, 9, -1, 10, 2**63}
    assert any(o.get("chunking") is True and o["input"] == fuzz_edges.LONG for o in overlap)
    assert b'"chunk_overlap": 1e400' in b"".join(c.body for c in cases)
    edge = next(c for c in cases if c.out_of_range and c.field == "chunk_overlap")
    named = json.dumps({"error": {"message": "m", "type": "t", "code": "c", "param": "chunk_overlap"}})
    unnamed = json.dumps({"error": {"message": "bad number", "type": "t", "code": "c", "param": None}})
    assert fuzz_edges.failure(edge, 400, named) is None
    assert "does not name" in fuzz_edges.failure(edge, 400, unnamed)
    assert fuzz_edges.failure(edge, 500, named).startswith("500")
    assert "not JSON" in fuzz_edges.failure(edge, 400, "Bad Request")
