"""The rerank route on weightless fakes: sorting, ``top_n``, documents returned, window scores, and its bodies'
mistakes each a 400 that names the field."""

from __future__ import annotations

import re

import pytest

from embedrank.testing.fake import FakeCrossEncoder
from tests.service.fakes import CE, ENCODER, MODEL, assert_error, rerank

pytestmark = pytest.mark.kernel_free


DOCS = [
    "Bananas are yellow.",
    "The tilt of Earth's axis causes the seasons.",
    "Seasons change through the year.",
    "Bananas are yellow.",
]


def test_rerank_defaults_sorting_and_scores(client):
    resp = rerank(client, documents=[{"text": d} for d in DOCS])
    assert resp.status_code == 200
    body = resp.json()
    assert re.fullmatch(r"rerank-[0-9a-f]{32}", body["id"])
    assert body["model"] == MODEL
    results = body["results"]
    assert len(results) == len(DOCS)  # top_n defaults to all
    assert all(set(r) == {"index", "relevance_score"} for r in results)  # no document by default
    vectors = ENCODER.encode(["what causes the seasons", *DOCS])
    ref = vectors[1:] @ vectors[0]
    for r in results:
        assert r["relevance_score"] == pytest.approx(float(ref[r["index"]]), abs=1e-6)
    assert [r["index"] for r in results] == sorted(range(4), key=lambda i: (-round(float(ref[i]), 6), i))
    assert [r["index"] for r in results if r["index"] in (0, 3)] == [0, 3]  # identical documents: lower index first
    assert body["usage"]["total_tokens"] == sum(ENCODER.count_tokens(["what causes the seasons", *DOCS]))
    assert resp.headers["x-truncated-inputs"] == "0"


def test_rerank_top_n_documents_and_plain_strings(client):
    body = rerank(client, documents=DOCS, top_n=2, return_documents=True).json()
    assert len(body["results"]) == 2
    for r in body["results"]:
        assert r["document"] == {"text": DOCS[r["index"]]}
    assert len(rerank(client, documents=DOCS, top_n=50).json()["results"]) == len(DOCS)
    mixed = rerank(client, documents=[DOCS[0], {"text": DOCS[1]}], return_documents=False).json()
    assert len(mixed["results"]) == 2 and "document" not in mixed["results"][0]


def test_rerank_truncate_false_names_the_field_and_index(client):
    long = "season " * 40
    one = {"max_chunks_per_doc": 1}  # the first window only: what truncation scored
    err = assert_error(rerank(client, documents=["ok", "fine", long], truncate=False, **one), 400, "input_too_long")
    assert err["param"] == "documents" and "documents[2]" in err["message"]
    err = assert_error(
        client.post("/v1/rerank", json={"model": MODEL, "query": long, "documents": ["a"], "truncate": False}),
        400,
        "input_too_long",
        "query",
    )
    err = assert_error(rerank(client, model=CE, documents=["ok", long], truncate=False, **one), 400, "input_too_long")
    assert err["param"] == "documents" and "documents[1]" in err["message"]
    resp = rerank(client, documents=["ok", long], **one)
    assert resp.status_code == 200 and resp.headers["x-truncated-inputs"] == "1"
    chunked = rerank(client, documents=["ok", long], truncate=False)  # chunked by default: nothing left out
    assert chunked.status_code == 200 and chunked.headers["x-truncated-inputs"] == "0"
    assert chunked.json()["usage"]["chunked_documents"] == 1


def test_cross_encoder_serves_its_scores_and_refuses_embeddings(client):
    body = rerank(client, model=CE, documents=DOCS, max_chunks_per_doc=1).json()
    ref = FakeCrossEncoder(max_seq_length=16).score_batch([("what causes the seasons", d) for d in DOCS]).values
    assert {r["index"]: r["relevance_score"] for r in body["results"]} == pytest.approx(dict(enumerate(ref.tolist())))
    assert [r["index"] for r in body["results"]] == sorted(range(4), key=lambda i: (-ref[i], i))
    assert_error(client.post("/v1/embeddings", json={"model": CE, "input": "x"}), 400, "model_wrong_kind", "model")


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"query": "q", "documents": []}, "empty_documents", "documents"),
        ({"query": "  ", "documents": ["a"]}, "empty_query", "query"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "invalid_value", "top_n"),
        ({"query": "q"}, "missing_field", "documents"),
        ({"query": "q", "documents": [{"content": "a"}]}, None, None),
    ],
)
def test_rerank_400s(client, body, code, param):
    assert_error(client.post("/v1/rerank", json={"model": MODEL, **body}), 400, code, param)


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"top_n": "2"}, "top_n"), ({"return_documents": 1}, "return_documents"), ({"top_n": 0}, "top_n")],
)
def test_rerank_fields_are_not_coerced(client, extra, param):
    assert_error(rerank(client, documents=["a", "b"], **extra), 400, None, param)


def test_an_over_long_query_is_named_query(client):
    body = {"model": MODEL, "query": "word " * 40, "documents": ["a"], "truncate": False}
    err = assert_error(client.post("/v1/rerank", json=body), 400, "input_too_long", "query")
    assert err["message"].startswith("query is longer"), err["message"]


def test_a_query_is_blank_by_json_schemas_whitespace(client):
    """The schema says a query matches ``\\S`` (ECMA-262): U+0085 is not whitespace there, so it is a query."""
    ok = client.post("/v1/rerank", json={"model": MODEL, "query": "\u0085", "documents": ["a"]})
    assert ok.status_code == 200, ok.text
    blank = client.post("/v1/rerank", json={"model": MODEL, "query": " \t\u3000", "documents": ["a"]})
    assert_error(blank, 400, "empty_query", "query")
