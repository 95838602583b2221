"""The service on weightless fake models, as the HTTP tests of ``tests/service`` build it: the settings, the app,
the error body every route answers with, and a request to each of the two main routes."""

from __future__ import annotations

from embedrank.testing.fake import FakeCrossEncoder, FakeEncoder
from service.app import create_app
from service.settings import Auth, Engine, ModelEntry, Models, Settings

MODEL = "fake-encoder"
CE = "fake-ce"
KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
ENCODER = FakeEncoder(MODEL, dimension=32, max_seq_length=16)
BASE = Settings(
    auth=Auth(api_keys=(KEY,)),
    models=Models(entries=(ModelEntry(id=MODEL, aliases=("fe",)),)),
    engine=Engine(batch_wait_ms=0, tune_malloc=False),
)


def fakes() -> dict:
    return {MODEL: ENCODER, CE: FakeCrossEncoder(CE, max_seq_length=16)}


def make_app(settings: Settings = BASE, **kwargs):
    return create_app(settings, wait_for_models=True, models=kwargs.pop("models", None) or fakes(), **kwargs)


def assert_error(resp, status, code=None, param=None):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code", "request_id"}
    assert body["error"]["request_id"] == resp.headers["x-request-id"]  # the same id in the header
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code
    if param is not None:
        assert body["error"]["param"] == param
    assert "Traceback" not in resp.text
    return body["error"]


def embed(client, **body):
    return client.post("/v1/embeddings", json={"model": MODEL, **body})


def rerank(client, model=MODEL, **body):
    return client.post("/v1/rerank", json={"model": model, "query": "what causes the seasons", **body})
