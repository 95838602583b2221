"""The served API description: routes, examples and errors, the limits and models it states, and the manual's
HTTP reference rendered from it."""

from __future__ import annotations

import pytest
from litestar.testing import TestClient

from service.settings import Auth, Engine, Settings
from tests.service.fakes import KEY, embed, make_app, rerank

pytestmark = pytest.mark.kernel_free


def test_openapi_describes_routes_examples_and_errors(client):
    schema = client.get("/openapi.json").json()
    text = client.get("/openapi.json").text
    assert "SPEC" not in text and "shared/" not in text  # the description speaks for itself, no outside file
    for path in ("/v1/embeddings", "/v1/rerank", "/v1/models", "/health", "/metrics"):
        assert path in schema["paths"]
    post = schema["paths"]["/v1/embeddings"]["post"]
    assert {"400", "401", "404", "413", "415", "429", "503"} <= set(post["responses"])
    content = post["requestBody"]["content"]["application/json"]
    assert content.get("examples") or content["schema"].get("examples")
    assert schema["paths"]["/v1/rerank"]["post"]["responses"]["200"]["content"]["application/json"].get("examples")
    components = schema["components"]["schemas"]
    assert {"EmbeddingsRequest", "RerankRequest", "EmbeddingList", "RerankResponse", "ErrorResponse"} <= set(components)


def test_schema_states_the_limits_the_server_enforces(client):
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    emb, rr = schemas["EmbeddingsRequest"]["properties"], schemas["RerankRequest"]["properties"]
    text = str(emb["input"])
    assert "'minLength': 1" in text and "'minItems': 1" in text
    assert "'minimum': 1" in str(emb["dimensions"]) and "'minimum': 1" in str(rr["top_n"])
    assert rr["query"]["minLength"] == 1 and rr["documents"]["minItems"] == 1
    paths = client.get("/openapi.json").json()["paths"]
    assert paths["/health"]["get"]["security"] == []  # documented as open, as it is
    assert "401" in paths["/metrics"]["get"]["responses"]
    assert "408" in paths["/v1/embeddings"]["post"]["responses"]


def test_schema_names_the_served_models_and_limits(client):
    """``model`` is an enum of the ids and aliases ``/v1/models`` lists for the route; limits are bounds."""
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    emb, rr = schemas["EmbeddingsRequest"]["properties"], schemas["RerankRequest"]["properties"]
    cards = client.get("/v1/models").json()["data"]
    served = {
        cap: {name for m in cards if cap in m["capabilities"] for name in [m["id"], *m["aliases"]]}
        for cap in ("embeddings", "rerank")
    }
    assert set(emb["model"]["enum"]) == served["embeddings"] and set(rr["model"]["enum"]) == served["rerank"]
    assert emb["dimensions"]["oneOf"][0]["maximum"] == max(m["dimension"] for m in cards if m["dimension"])
    texts = emb["input"]["oneOf"][1]
    assert texts["maxItems"] == 2048 and texts["items"]["oneOf"][0]["maxLength"] == 100_000  # texts or id arrays
    assert rr["documents"]["maxItems"] == 1000 and rr["query"]["maxLength"] == 100_000


def test_integral_numbers_are_integers_as_json_schema_says(client):
    """JSON Schema's integer is any number with a zero fraction: 10.0 is 10, 10.5 and "10" are refused."""
    resp = embed(client, input="x", dimensions=10.0)
    assert resp.status_code == 200 and len(resp.json()["data"][0]["embedding"]) == 10
    assert rerank(client, documents=["a", "b", "c"], top_n=2.0).json()["results"].__len__() == 2


def test_the_manuals_http_reference_is_the_served_description_rendered():
    """docs/http-api.md is what a default server's /openapi.json says, rendered: every route, its body and its
    error codes, and every schema's fields."""
    from pathlib import Path

    from service.openapi_reference import openapi_document, render_reference

    with TestClient(make_app(Settings(auth=Auth(api_keys=(KEY,)), engine=Engine(tune_malloc=False)))) as c:
        served = c.get("/openapi.json").json()
    document = openapi_document()
    assert document["paths"].keys() == served["paths"].keys()
    assert document["components"]["schemas"].keys() == served["components"]["schemas"].keys()
    page = (Path(__file__).resolve().parents[2] / "docs" / "http-api.md").read_text()
    assert page == render_reference(document), "run: python -m service.openapi_reference > docs/http-api.md"
    for path, item in document["paths"].items():
        for method in item:
            assert f"`{path}`" in page, (method, path)
    for name in document["components"]["schemas"]:
        assert f"### {name}\n" in page
