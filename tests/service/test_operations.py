"""The operator's routes and the per-model settings: models, health, metrics counted by route, priority, backend and
precision per model."""

from __future__ import annotations

import pytest

from embedrank.testing.fake import FakeEncoder
from service.settings import Settings, SettingsError
from tests.service.fakes import BASE, CE, KEY, MODEL, assert_error, embed, rerank

pytestmark = pytest.mark.kernel_free


def test_models_health_metrics(client):
    assert embed(client, input="count me").status_code == 200
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert cards[MODEL]["capabilities"] == ["embeddings", "rerank"] and cards[MODEL]["scorer"] == "bi-encoder"
    assert cards[MODEL]["dimension"] == 32 and cards[MODEL]["max_tokens"] == 16 and cards[MODEL]["aliases"] == ["fe"]
    assert cards[CE]["capabilities"] == ["rerank"] and cards[CE]["scorer"] == "cross-encoder"
    assert client.get("/health", headers={"Authorization": ""}).json()["status"] == "ok"
    text = client.get("/metrics").text
    for name in (
        "embedrank_requests_total",
        "embedrank_request_seconds",
        "embedrank_batch_size",
        "embedrank_batch_seconds",
        "embedrank_queue_depth",
        "embedrank_tokens_total",
        "embedrank_dropped_items",
    ):
        assert name in text
    assert 'embedrank_requests_total{method="POST",route="/v1/embeddings",status="200"} 1.0' in text
    assert f'embedrank_tokens_total{{model="{MODEL}"}} 4.0' in text  # "count me": 2 words + 2 special tokens


def test_every_served_route_is_counted_under_its_own_path(client):
    from service.app import ROUTES

    served = {route.path for route in client.app.routes if not route.path.startswith("/docs")}  # Litestar's pages
    assert served == ROUTES
    assert client.post("/v1/tokenize", json={"model": MODEL, "input": "count me"}).status_code == 200
    text = client.get("/metrics").text
    assert 'embedrank_requests_total{method="POST",route="/v1/tokenize",status="200"} 1.0' in text


def test_head_health_and_long_model_names(client):
    assert client.head("/health").status_code == 200
    err = assert_error(client.post("/v1/embeddings", json={"model": "m" * 100_000, "input": "x"}), 404)
    assert len(err["message"]) < 400 and "100000 characters" in err["message"]


def test_priority_is_accepted_and_typed(client):
    assert embed(client, input="x", priority=-5).status_code == 200
    assert rerank(client, documents=["a"], priority=3).status_code == 200
    assert_error(embed(client, input="x", priority="high"), 400, "invalid_type", "priority")


def test_engine_serves_a_lower_priority_value_first():
    from embedrank.serving.scheduler import FairQueue, QueuedJob

    q = FairQueue()
    normal, urgent = QueuedJob(est=[10] * 3), QueuedJob(est=[10], priority=-1)
    q.push(normal)
    q.push(urgent)
    assert q.take(max_tokens=10, max_size=1)[0][0] is urgent


def test_backend_and_precision_per_model_from_env_and_toml(tmp_path):
    env = {
        "EMBEDRANK_MODELS": "a=sentence-transformers/all-MiniLM-L6-v2@openvino:int8,b=all-MiniLM-L6-v2@torch,c",
        "EMBEDRANK_PRECISION": "int8",
    }
    with pytest.raises(SettingsError, match=r"model 'b': backend 'torch' runs precision fp32, bf16, fp16; got 'int8'"):
        Settings.from_env(env)
    ok = Settings.from_env({**env, "EMBEDRANK_PRECISION": ""})
    got = [(m.id, m.path, m.backend, m.precision) for m in ok.models.entries]
    assert got == [
        ("a", "sentence-transformers/all-MiniLM-L6-v2", "openvino", "int8"),
        ("b", "all-MiniLM-L6-v2", "torch", None),
        ("c", None, None, None),
    ]
    default = Settings.from_env({"EMBEDRANK_BACKEND": "torch"}).models.entries
    assert [(m.id, m.backend) for m in default] == [("sentence-transformers/all-MiniLM-L6-v2", "torch")]
    with pytest.raises(SettingsError, match="unknown backend 'cuda'"):
        Settings.from_env({"EMBEDRANK_BACKEND": "cuda"})
    with pytest.raises(SettingsError, match="@backend"):
        Settings.from_env({"EMBEDRANK_MODELS": "m@"})
    toml = tmp_path / "embedrank.toml"
    toml.write_text(
        'backend = "onnx"\n[[models]]\nid = "m1"\npath = "all-MiniLM-L6-v2"\n'
        '[[models]]\nid = "m2"\npath = "all-MiniLM-L6-v2"\nbackend = "openvino"\nprecision = "bf16"\n'
    )
    models = Settings.from_env({"EMBEDRANK_CONFIG": str(toml)}).models.entries
    assert [(m.id, m.backend, m.precision) for m in models] == [("m1", "onnx", None), ("m2", "openvino", "bf16")]


def test_models_card_reports_backend(client):
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert (cards[MODEL]["backend"], cards[MODEL]["precision"], cards[MODEL]["inference_precision"]) == (
        "fake",
        "fp32",
        "f32",
    )


def test_int8_ranges_are_fitted_before_the_service_is_ready(fake_service):
    class Counting(FakeEncoder):
        fits = 0

        def embed_for_ranges(self, texts, *, normalize):
            Counting.fits += 1
            return super().embed_for_ranges(texts, normalize=normalize)

    with fake_service({MODEL: Counting(MODEL, dimension=32)}, key=KEY, settings=BASE) as c:
        assert Counting.fits == 1  # at startup
        body = {"model": MODEL, "input": ["a b", "c d"], "embedding_types": ["int8", "uint8"], "dimensions": 16}
        assert c.post("/v1/embeddings", json=body).status_code == 200
        assert Counting.fits == 1  # no request pays for them


def test_a_replicas_metrics_are_combined_as_one_process_counts():
    """Counters and histograms summed over every process (one that ended too), gauges over the live ones, the
    gauges every process reads from what they share counted once, and the result parses as Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    from service.observability import SHARED_GAUGES, Metrics, combined

    def process(requests: int, in_progress: int, tokens: int) -> bytes:
        metrics = Metrics(frozenset({"/v1/embeddings"}))
        for _ in range(requests):
            metrics.observe_request("/v1/embeddings", "POST", 200, 0.003)
        metrics.in_progress.set(in_progress)
        metrics.tokens.labels("m").inc(tokens)
        shared = "embedrank_embedding_cache_entries"
        return metrics.render() + f"# TYPE {shared} gauge\n{shared} {requests * 10}.0\n".encode()

    text = combined([(process(3, 1, 30), True), (process(5, 2, 50), True), (process(7, 4, 70), False)]).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    route = (("method", "POST"), ("route", "/v1/embeddings"), ("status", "200"))
    assert samples[("embedrank_requests_total", route)] == 15
    assert samples[("embedrank_request_seconds_count", (("route", "/v1/embeddings"), ("status", "200")))] == 15
    assert (
        samples[("embedrank_request_seconds_bucket", (("le", "0.005"), ("route", "/v1/embeddings"), ("status", "200")))]
        == 15
    )
    assert samples[("embedrank_tokens_total", (("model", "m"),))] == 150
    assert samples[("embedrank_requests_in_progress", ())] == 3  # the process that ended holds none
    assert "embedrank_embedding_cache_entries" in SHARED_GAUGES
    assert samples[("embedrank_embedding_cache_entries", ())] == 50  # the largest of the live ones, not a sum
    assert not any(name.endswith("_created") for name, _ in samples)
