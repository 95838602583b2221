"""Task adapters through the service, on a weightless fake with jina-embeddings-v3's adapters
(``fake:encoder-with-adapters``: each adapter salts the hashed words, so each gives other vectors): the OpenAI body's
``adapter`` and Jina's ``task``, ``input_type`` mapped onto the retrieval adapters, Cohere's and TEI's bodies, every
bad value a 400 naming the choices, ``/v1/models`` listing them, the embedding cache keyed by adapter, and a batch
mixing adapters answered line by line as the direct requests. The real model's parity is
``tests/models/test_adapters.py``'s."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import numpy as np
import openai
import pytest
from litestar.testing import TestClient

from embedrank.testing.fake import FAKE_ADAPTER_PROMPTS, FAKE_ADAPTERS, fake_model
from service.app import create_app
from service.settings import Auth, Batches, Cache, Engine, ModelEntry, Models, Settings
from tests.service.batches.test_batch_api import jsonl, wait
from tests.service.fakes import assert_error

pytestmark = pytest.mark.kernel_free

KEY = "k"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXTS = ["tilt of the earth axis", "why summer is warm", "the moon's orbit"]
ADAPTED = fake_model("jina-like", "fake:encoder-with-adapters")
QUERY_PROMPT = FAKE_ADAPTER_PROMPTS["retrieval.query"]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    settings = Settings(
        auth=Auth(api_keys=(KEY,)),
        models=Models(
            entries=(
                ModelEntry(id="jina-like", path="fake:encoder-with-adapters"),
                ModelEntry(id="e5-like", path="fake:encoder-with-prompts"),
            )
        ),
        engine=Engine(tune_malloc=False),
        batches=Batches(batch_dir=str(tmp_path_factory.mktemp("batches"))),
        cache=Cache(embedding_cache_direct=True),
    )
    with TestClient(create_app(settings, wait_for_models=True)) as c:
        c.headers.update(AUTH)
        yield c


def vectors(resp: Any) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    return np.array([d["embedding"] for d in resp.json()["data"]], dtype=np.float32)


def expected(adapter: str | None, prompt: str = "") -> np.ndarray:
    return ADAPTED.encode([prompt + t for t in TEXTS], adapter=adapter)


@pytest.mark.parametrize(
    ("fields", "adapter", "prompt"),
    [
        ({"adapter": "text-matching"}, "text-matching", ""),
        ({"adapter": "retrieval.query"}, "retrieval.query", ""),  # an adapter by name: the prompt is the request's
        ({"task": "retrieval.query"}, "retrieval.query", QUERY_PROMPT),  # Jina's task: the adapter and its prompt
        ({"task": "retrieval.passage"}, "retrieval.passage", ""),
        ({"task": "text-matching"}, "text-matching", ""),
        ({"input_type": "search_query"}, "retrieval.query", QUERY_PROMPT),  # the query role's adapter
        ({"input_type": "document"}, "retrieval.passage", ""),
        ({"input_type": "clustering"}, None, ""),  # no adapter of that role: the base model
        ({}, None, ""),
    ],
)
def test_adapter_task_and_input_type_pick_the_adapter(client, fields, adapter, prompt):
    got = vectors(client.post("/v1/embeddings", json={"model": "jina-like", "input": TEXTS, **fields}))
    np.testing.assert_allclose(got, expected(adapter, prompt), atol=1e-6)
    assert np.abs(expected("text-matching") - expected(None)).max() > 0.1  # the adapters give other vectors


def test_cohere_and_tei_bodies_take_the_adapter(client):
    body = {"model": "jina-like", "texts": TEXTS, "adapter": "text-matching", "embedding_types": ["float"]}
    cohere = client.post("/v2/embed", json=body)
    assert cohere.status_code == 200, cohere.text
    np.testing.assert_allclose(cohere.json()["embeddings"]["float"], expected("text-matching"), atol=1e-6)
    tei = client.post("/embed", json={"model": "jina-like", "inputs": TEXTS, "adapter": "text-matching"})
    assert tei.status_code == 200, tei.text
    np.testing.assert_allclose(tei.json(), expected("text-matching"), atol=1e-6)


def test_the_models_list_names_each_models_adapters(client):
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert cards["jina-like"]["adapters"] == list(FAKE_ADAPTERS) and cards["e5-like"]["adapters"] == []


def test_a_task_of_a_role_selects_the_prompt_of_a_model_without_adapters(client):
    got = vectors(client.post("/v1/embeddings", json={"model": "e5-like", "input": TEXTS, "task": "retrieval.query"}))
    plain = fake_model("e5-like", "fake:encoder-with-prompts")
    np.testing.assert_allclose(got, plain.encode(["query: " + t for t in TEXTS]), atol=1e-6)


@pytest.mark.parametrize(
    ("model", "fields", "param", "words"),
    [
        (
            "jina-like",
            {"adapter": "nope"},
            "adapter",
            "its adapters: retrieval.query, retrieval.passage, text-matching",
        ),
        (
            "jina-like",
            {"task": "separation"},
            "task",
            "its adapters: retrieval.query, retrieval.passage, text-matching",
        ),
        ("e5-like", {"adapter": "text-matching"}, "adapter", "it has no adapters"),
        ("e5-like", {"task": "text-matching"}, "task", "it has no adapters"),
        ("jina-like", {"adapter": ""}, "adapter", ""),
    ],
)
@pytest.mark.parametrize("route", ["/v1/embeddings", "/v1/tokenize"])
def test_an_adapter_or_task_the_model_lacks_is_a_400_naming_the_choices(client, route, model, fields, param, words):
    resp = client.post(route, json={"model": model, "input": TEXTS, **fields})
    error = assert_error(resp, 400, param=param)
    assert words in error["message"]


def test_tokenize_counts_the_prompt_a_task_or_role_brings_as_embeddings_does(client):
    def counted(**fields: Any) -> list[int]:
        resp = client.post("/v1/tokenize", json={"model": "jina-like", "input": TEXTS, **fields})
        assert resp.status_code == 200, resp.text
        return [d["untruncated_count"] for d in resp.json()["data"]]

    def used(**fields: Any) -> int:
        resp = client.post("/v1/embeddings", json={"model": "jina-like", "input": TEXTS, **fields})
        assert resp.status_code == 200, resp.text
        return int(resp.json()["usage"]["prompt_tokens"])

    bare = counted()
    for fields in ({"task": "retrieval.query"}, {"input_type": "query"}):
        with_prompt = counted(**fields)
        assert all(a > b for a, b in zip(with_prompt, bare, strict=True)), fields  # the query adapter's prompt
        assert sum(with_prompt) == used(**fields)
    assert counted(adapter="retrieval.query") == bare == counted(task="text-matching")  # no prompt of their own


def hits(client: TestClient) -> float:
    found = re.search(
        r'^embedrank_embedding_cache_lookups_total\{result="hit"\} (\S+)$', client.get("/metrics").text, re.M
    )
    return float(found[1]) if found else 0.0


def test_the_cache_keeps_each_adapters_vectors_apart(client):
    texts = [f"{t}, cached" for t in TEXTS]
    before = hits(client)
    for adapter in (None, "text-matching", None, "text-matching"):  # the second round comes from the cache
        fields = {"adapter": adapter} if adapter else {}
        got = vectors(client.post("/v1/embeddings", json={"model": "jina-like", "input": texts, **fields}))
        np.testing.assert_allclose(got, ADAPTED.encode(texts, adapter=adapter), atol=1e-6)
    assert hits(client) - before == 2 * len(texts)  # the first round computed each adapter's own


def test_a_batch_mixing_adapters_answers_each_line_as_its_direct_request(client):
    api = openai.OpenAI(api_key=KEY, base_url=f"{client.base_url}/v1", http_client=client, max_retries=0)
    choices: list[dict[str, Any]] = [{"adapter": a} for a in FAKE_ADAPTERS] + [{"task": "retrieval.query"}, {}]
    rows = [
        {
            "custom_id": f"l-{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "jina-like", "input": [TEXTS[i % 3], f"line {i}"], **choices[i % len(choices)]},
        }
        for i in range(40)
    ]
    uploaded = api.files.create(file=("in.jsonl", io.BytesIO(jsonl(rows))), purpose="batch")
    done = wait(
        api, api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h").id
    )
    assert done.status == "completed" and done.request_counts.completed == len(rows)
    output = [json.loads(x) for x in api.files.content(done.output_file_id).content.splitlines()]
    for row, line in zip(rows, output, strict=True):
        direct = client.post("/v1/embeddings", json=row["body"])
        assert line["response"]["body"]["data"] == direct.json()["data"], row["body"]


def test_int8_vectors_take_the_adapters_own_ranges(client):
    from embedrank.math.quantization import quantize

    for adapter in ("text-matching", None):
        fields = {"adapter": adapter} if adapter else {}
        body = {"model": "jina-like", "input": TEXTS, "embedding_types": ["int8"], **fields}
        resp = client.post("/v1/embeddings", json=body)
        assert resp.status_code == 200, resp.text
        got = np.array([d["embeddings"]["int8"] for d in resp.json()["data"]], dtype=np.int8)
        ranges = ADAPTED.quantization_ranges(adapter=adapter)
        np.testing.assert_array_equal(got, quantize(expected(adapter), "int8", ranges))
    assert np.abs(ADAPTED.quantization_ranges(adapter="text-matching") - ADAPTED.quantization_ranges()).max() > 0.01
