"""Images through the service: every request shape a client already sends (OpenAI data URLs, Infinity's
``modality``, Cohere v2 ``images`` and ``inputs``, a batch line), one vector each, equal to
sentence-transformers'; hostile images refused before they cost anything."""

from __future__ import annotations

import base64
import io
import json
import resource
import time
from pathlib import Path

import numpy as np
import openai
import pytest
from litestar.testing import TestClient

from embedrank.testing.hostile_files import png_claiming
from embedrank.testing.tiny_images import drawn_image, tiny_image_text
from service.app import create_app
from service.settings import Auth, Batches, Engine, Limits, ModelEntry, Models, Settings

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


@pytest.mark.kernels  # parity with sentence-transformers on torch
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


def test_a_decompression_bomb_is_413_before_any_pixel_is_decoded(client, pillow_decoders) -> None:
    bomb = "data:image/png;base64," + base64.b64encode(png_claiming(100_000, 100_000)).decode()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    opened = pillow_decoders
    resp = client.post("/v1/embeddings", json={"model": "clip", "input": [bomb]})
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large", resp.text
    assert "10,000,000,000 pixels" in resp.json()["error"]["message"]
    assert opened == []  # refused from the header
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
    planned = ModelPool((ModelEntry(id="clip", path=clip_path, precision="auto"),)).plans["clip"]
    assert (planned.backend, planned.precision) == ("openvino", "auto")  # decided when loaded


def test_the_images_guide_runs(client, monkeypatch) -> None:
    """Every ``py`` block of docs/guides/images.md, in order, against the app (the tiny CLIP as ``clip``)."""
    import re

    import cohere

    guide = Path(__file__).resolve().parents[2] / "docs" / "guides" / "images.md"
    blocks = re.findall(r"^```py\n(.*?)^```", guide.read_text(encoding="utf-8"), flags=re.S | re.M)
    real_openai, real_cohere = openai.OpenAI, cohere.ClientV2
    monkeypatch.setattr(
        openai,
        "OpenAI",
        lambda *, base_url, api_key: real_openai(api_key=KEY, base_url=f"{client.base_url}/v1", http_client=client),
    )
    monkeypatch.setattr(
        cohere,
        "ClientV2",
        lambda *, api_key, base_url: real_cohere(api_key=KEY, base_url=str(client.base_url), httpx_client=client),
    )
    namespace: dict = {"__name__": "docs_example"}
    for number, block in enumerate(blocks, start=1):
        exec(compile(block, f"docs/guides/images.md py block {number}", "exec"), namespace)
    assert len(blocks) == 3 and len(namespace["vectors"]) == 2 and len(namespace["vectors"][0]) == 48


@pytest.fixture(scope="module")
def image_host():
    """An HTTP server on loopback in a thread: an image, a body too large, a slow one, redirects, a 404."""
    import http.server
    import threading

    png = base64.b64decode(data_url(drawn_image("circle", (30, 60, 220), size=(80, 50))).split(",", 1)[1])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            port = self.server.server_address[1]
            routes = {
                "/a.png": (200, {"Content-Type": "image/png"}, png),
                "/big.png": (200, {"Content-Type": "image/png"}, png + b"\0" * 300_000),
                "/same": (302, {"Location": "/a.png"}, b""),
                "/elsewhere": (302, {"Location": f"http://localhost:{port}/a.png"}, b""),
            }
            if self.path == "/slow.png":
                time.sleep(1.5)
            status, headers, body = routes.get(self.path, (404, {}, b"missing"))
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", png
    server.shutdown()


def test_remote_images_only_from_allowed_hosts_and_never_private_by_default(clip_path, image_host) -> None:
    from service.settings import Images

    base, png = image_host
    for private, allowed in ((False, "refused: private"), (True, "fetched")):
        settings = Settings(
            auth=Auth(api_keys=(KEY,)),
            models=Models(entries=(ModelEntry(id="clip", path=clip_path),)),
            engine=Engine(batch_wait_ms=0, tune_malloc=False),
            limits=Limits(max_image_bytes=200_000),
            images=Images(image_url_hosts=("127.0.0.1",), image_url_private=private, image_fetch_seconds=1.0),
        )
        with TestClient(create_app(settings, wait_for_models=True)) as app:
            app.headers.update({"Authorization": f"Bearer {KEY}"})

            def embed(url: str):
                return app.post("/v1/embeddings", json={"model": "clip", "input": [url], "modality": "image"})

            if allowed == "refused: private":
                resp = embed(f"{base}/a.png")
                assert resp.status_code == 400 and "private or loopback" in resp.json()["error"]["message"]
                continue
            direct = app.post(
                "/v1/embeddings",
                json={"model": "clip", "input": ["data:image/png;base64," + base64.b64encode(png).decode()]},
            )
            for path in ("/a.png", "/same"):
                resp = embed(base + path)
                assert resp.status_code == 200, resp.text
                assert cosine(resp.json()["data"][0]["embedding"], direct.json()["data"][0]["embedding"]) >= 0.999999
            for path, status, words in (
                ("/elsewhere", 400, "redirects to another host"),
                ("/big.png", 413, "over the limit of 200,000 bytes"),
                ("/slow.png", 400, "within image_fetch_seconds=1"),
                ("/missing.png", 400, "HTTP 404"),
            ):
                resp = embed(base + path)
                assert resp.status_code == status and words in resp.json()["error"]["message"], (path, resp.text)
            resp = embed("http://localhost:1/a.png")  # a host not in the list: not even resolved
            assert resp.status_code == 400 and resp.json()["error"]["code"] == "image_url_not_allowed"


def test_broken_images_through_the_service_are_4xx_never_5xx(client) -> None:
    """The decoder path fuzzed through HTTP: every accepted format cut and flipped at seeded random points."""
    rng = np.random.default_rng(11)
    picture = drawn_image("square", (220, 30, 30), size=(60, 40))
    statuses: dict[int, int] = {}
    for fmt in ("PNG", "JPEG", "WEBP", "GIF"):
        raw = bytearray(base64.b64decode(data_url(picture, fmt).split(",", 1)[1]))
        for case in range(12):
            broken = bytearray(raw)
            if case % 2:
                broken = broken[: int(rng.integers(1, len(broken)))]
            else:
                for at in rng.integers(0, len(broken), size=8):
                    broken[at] = int(rng.integers(0, 256))
            url = f"data:image/{fmt.lower()};base64," + base64.b64encode(bytes(broken)).decode()
            resp = client.post("/v1/embeddings", json={"model": "clip", "input": [url]})
            statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
            assert resp.status_code < 500, resp.text
    assert sum(statuses.values()) == 48 and statuses.get(400, 0) > 0, statuses
