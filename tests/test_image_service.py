"""Images through the service: every request shape a client already sends (OpenAI data URLs, Infinity's
``modality``, Cohere v2 ``images`` and ``inputs``, a batch line), one vector each, equal to
sentence-transformers'; hostile images refused before they cost anything."""

from __future__ import annotations

import base64
import io
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import openai
import pytest
from litestar.testing import TestClient

from embedrank.testing.tiny_images import drawn_image, tiny_image_text
from service.app import create_app
from service.settings import Auth, Batches, Engine, Limits, ModelEntry, Models, Settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_image_text import png_claiming

KEY = "image-key"


def data_url(image, fmt: str = "PNG") -> str:
    out = io.BytesIO()
    image.save(out, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(out.getvalue()).decode()


@pytest.fixture(scope="module")
def clip_path() -> str:
    return tiny_image_text("clip")


@pytest.fixture(scope="module")
def client(clip_path, tmp_path_factory):
    settings = Settings(
        auth=Auth(api_keys=(KEY,)),
        models=Models(entries=(ModelEntry(id="clip", path=clip_path), ModelEntry(id="text", path="fake:encoder"))),
        engine=Engine(batch_wait_ms=0, tune_malloc=False),
        limits=Limits(max_images=4, max_image_bytes=200_000, max_image_pixels=1_000_000),
        batches=Batches(batch_dir=str(tmp_path_factory.mktemp("batches"))),
    )
    with TestClient(create_app(settings, wait_for_models=True)) as test_client:
        test_client.headers.update({"Authorization": f"Bearer {KEY}"})
        yield test_client


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_every_request_shape_gives_sentence_transformers_vector(client, clip_path) -> None:
    from sentence_transformers import SentenceTransformer

    picture = drawn_image("circle", (30, 60, 220), size=(80, 50))
    url = data_url(picture)
    st = SentenceTransformer(clip_path, device="cpu")
    (want_image,), (want_text,) = st.encode([picture]), st.encode(["a blue circle"])
    api = openai.OpenAI(api_key=KEY, base_url=f"{client.base_url}/v1", http_client=client, max_retries=0)
    got = {
        "openai data URL": api.embeddings.create(model="clip", input=[url]).data[0].embedding,
        "modality image": api.embeddings.create(model="clip", input=[url], extra_body={"modality": "image"})
        .data[0]
        .embedding,
    }
    cohere = {
        "cohere images": {"images": [url], "input_type": "image"},
        "cohere inputs": {
            "inputs": [{"content": [{"type": "image_url", "image_url": {"url": url}}]}],
            "input_type": "image",
        },
    }
    for name, body in cohere.items():
        resp = client.post("/v2/embed", json={"model": "clip", "embedding_types": ["float"], **body})
        assert resp.status_code == 200, resp.text
        got[name] = resp.json()["embeddings"]["float"][0]
    for name, vector in got.items():
        assert cosine(vector, want_image) >= 0.9999, name
    mixed = api.embeddings.create(model="clip", input=["a blue circle", url])
    assert (
        cosine(mixed.data[0].embedding, want_text) >= 0.9999 and cosine(mixed.data[1].embedding, want_image) >= 0.9999
    )
    assert mixed.usage.prompt_tokens > 16  # the text's tokens and the image's 16 patches and class token
    listed = {m["id"]: m["inputs"] for m in client.get("/v1/models").json()["data"]}
    assert listed == {"clip": ["text", "image"], "text": ["text"]}


def test_a_batch_line_embeds_an_image(client) -> None:
    url = data_url(drawn_image("square", (220, 30, 30)))
    line = {"custom_id": "img", "method": "POST", "url": "/v1/embeddings", "body": {"model": "clip", "input": [url]}}
    api = openai.OpenAI(api_key=KEY, base_url=f"{client.base_url}/v1", http_client=client, max_retries=0)
    upload = api.files.create(file=("lines.jsonl", json.dumps(line).encode() + b"\n"), purpose="batch")
    batch = api.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    deadline = time.monotonic() + 30
    while batch.status not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.05)
        batch = api.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    (answer,) = [json.loads(row) for row in api.files.content(batch.output_file_id).text.splitlines()]
    direct = client.post("/v1/embeddings", json={"model": "clip", "input": [url]}).json()["data"][0]["embedding"]
    assert cosine(answer["response"]["body"]["data"][0]["embedding"], direct) >= 0.999999


def test_a_decompression_bomb_is_413_in_milliseconds(client) -> None:
    bomb = "data:image/png;base64," + base64.b64encode(png_claiming(100_000, 100_000)).decode()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    resp = client.post("/v1/embeddings", json={"model": "clip", "input": [bomb]})
    took = time.perf_counter() - started
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large", resp.text
    assert "10,000,000,000 pixels" in resp.json()["error"]["message"] and took < 0.1
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 20_000  # KiB: nothing decompressed


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"input": ["http://127.0.0.1/cat.png"], "modality": "image"}, 400, "image_url_not_allowed", "input"),
        ({"input": ["a cat"], "modality": "image"}, 400, "invalid_image", "input"),
        ({"input": ["data:image/png;base64,iVBORw0KGgo="]}, 400, "invalid_value", "input"),  # truncated PNG
        ({"input": ["data:image/bmp;base64,Qk0="]}, 415, "unsupported_media_type", "input"),
        ({"input": ["data:image/png;base64,R0lGODlhAQABAAAAACw="]}, 400, "invalid_value", "input"),  # a GIF, cut
        ({"input": ["data:image/png;base64," + "A" * 300_000]}, 413, "request_too_large", "input"),
        ({"input": [data_url(drawn_image("square", (1, 2, 3)))] * 5}, 400, "too_many_images", "input"),
        ({"input": [data_url(drawn_image("square", (1, 2, 3), size=(1200, 1000)))]}, 413, "request_too_large", "input"),
        ({"input": ["a red square"], "embedding_types": ["int8"]}, 400, "output_not_available", "embedding_types"),
        ({"input": ["data:image/png;base64,AAAA"], "chunking": True}, 400, "invalid_value", "chunking"),
    ],
)
def test_images_refused_with_a_status_that_names_the_field(client, body, status, code, param) -> None:
    resp = client.post("/v1/embeddings", json={"model": "clip", **body})
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error


def test_a_text_model_given_an_image_and_cohere_shapes_refused(client) -> None:
    url = data_url(drawn_image("square", (1, 2, 3)))
    resp = client.post("/v1/embeddings", json={"model": "text", "input": ["a cat", url]})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "input"
    assert "input[1] is an image, but model 'text' embeds text only" in resp.json()["error"]["message"]
    resp = client.post("/v2/embed", json={"model": "text", "images": [url], "input_type": "image"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "images", resp.text
    as_text = client.post("/v1/embeddings", json={"model": "text", "input": [url], "modality": "text"})
    assert as_text.status_code == 200  # modality text: a data URL is only a string
    for body, message in [
        ({"texts": ["a"], "images": [url]}, "the request has texts and images"),
        ({}, "the request has none of them"),
        (
            {
                "inputs": [
                    {"content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": url}}]}
                ]
            },
            "inputs[0].content has 2 parts",
        ),
        ({"images": ["https://example.com/a.png"]}, "does not fetch images"),
    ]:
        resp = client.post("/v2/embed", json={"model": "clip", "input_type": "image", **body})
        assert resp.status_code == 400 and message in resp.json()["error"]["message"], resp.text


def test_an_image_text_entry_runs_fp32_or_bf16_only(clip_path) -> None:
    from embedrank.errors import ConfigurationError
    from embedrank.serving.pool import ModelPool

    for precision, backend, message in (
        ("int8", "openvino", "image-text model, which runs in fp32 or bf16"),
        ("bf16", "onnx", "backend 'onnx' runs precision fp32, int8"),
    ):
        entry = ModelEntry(id="clip", path=clip_path, precision=precision, backend=backend)
        with pytest.raises(ConfigurationError, match=message):
            ModelPool((entry,))
