"""Many clients at once, and clients that leave: 200 mixed requests from 32 clients, and a request whose client is
gone is cancelled or answered 499."""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np
import pytest
from litestar.testing import AsyncTestClient

from embedrank.math.chunks import aggregate_window_scores
from embedrank.models.chunking import Chunking, split_windows
from embedrank.testing.fake import FakeCrossEncoder
from service.app import create_app
from service.settings import Engine
from tests.service.fakes import AUTH, BASE, CE, ENCODER, KEY, MODEL, fakes, make_app

pytestmark = pytest.mark.kernel_free


def test_200_mixed_requests_from_32_concurrent_clients():
    rng = np.random.default_rng(0)
    words = "retrieval ranking dense sparse vector query passage model token batch".split()
    requests = []
    for i in range(200):
        kind = ["embed1", "embed16", "rerank", "ce"][i % 4]
        n = {"embed1": 1, "embed16": 16, "rerank": 8, "ce": 8}[kind]
        texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 12)))) + f" n{i}x{j}" for j in range(n)]
        requests.append((kind, texts))
    app = create_app(
        msgspec.structs.replace(BASE, engine=Engine(tune_malloc=False)), wait_for_models=True, models=fakes()
    )
    scorer = FakeCrossEncoder(CE, max_seq_length=16)

    async def main():
        sem = asyncio.Semaphore(32)
        async with AsyncTestClient(app) as c:

            async def one(kind, texts):
                async with sem:
                    if kind in ("rerank", "ce"):
                        body = {
                            "model": CE if kind == "ce" else MODEL,
                            "query": texts[0],
                            "documents": texts[1:],
                            "max_chunks_per_doc": 1,  # compared with whole-document scoring below
                        }
                        return await c.post("/v1/rerank", json=body, headers=AUTH)
                    return await c.post("/v1/embeddings", json={"model": MODEL, "input": texts}, headers=AUTH)

            return await asyncio.gather(*(one(k, t) for k, t in requests))

    responses = asyncio.run(main())
    for (kind, texts), resp in zip(requests, responses, strict=True):
        assert resp.status_code == 200, resp.text
        body = resp.json()
        if kind == "rerank":
            vectors = ENCODER.encode(texts)
            ref = vectors[1:] @ vectors[0]
        elif kind == "ce":  # the first window of each document, sized to fit next to the query
            one = Chunking(max_chunks=1)
            windows = split_windows(texts[1:], scorer.token_offsets, window=scorer.chunk_window(texts[0]), chunking=one)
            window_scores = scorer.score_batch([(texts[0], t) for t in windows.texts]).values
            ref = aggregate_window_scores(window_scores, windows.owners, len(texts) - 1)
        else:
            got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
            assert [d["index"] for d in body["data"]] == list(range(len(texts)))
            np.testing.assert_allclose(got, ENCODER.encode(texts), atol=1e-6)
            continue
        assert sorted(r["index"] for r in body["results"]) == list(range(len(texts) - 1))
        for r in body["results"]:
            assert r["relevance_score"] == pytest.approx(float(ref[r["index"]]), abs=1e-6)


def test_client_gone_cancels_the_job():
    from service.errors import APIError
    from service.handling import respond as _respond

    cancelled = asyncio.Event()

    class GoneRequest:
        async def receive(self):
            return {"type": "http.disconnect"}

    async def work():
        try:
            await asyncio.Event().wait()  # until cancelled
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return None, 0

    async def main():
        with pytest.raises(APIError) as info:
            await _respond(GoneRequest(), work())
        assert info.value.status == 499
        await asyncio.sleep(0)
        assert cancelled.is_set()

    asyncio.run(main())


def test_client_gone_mid_body_is_499_not_500():
    app = make_app()

    async def main():
        async with AsyncTestClient(app) as c:
            sent = []
            messages = [
                {"type": "http.request", "body": b'{"model": "fake', "more_body": True},
                {"type": "http.disconnect"},
            ]

            async def receive():
                return messages.pop(0) if messages else {"type": "http.disconnect"}

            async def send(message):
                sent.append(message)

            scope = {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": "POST",
                "scheme": "http",
                "path": "/v1/embeddings",
                "raw_path": b"/v1/embeddings",
                "query_string": b"",
                "root_path": "",
                "headers": [(b"content-type", b"application/json"), (b"authorization", f"Bearer {KEY}".encode())],
                "client": ("127.0.0.1", 1234),
                "server": ("testserver", 80),
                "state": {},
            }
            await app(scope, receive, send)
            assert sent[0]["status"] == 499
            return (await c.get("/metrics", headers=AUTH)).text

    text = asyncio.run(main())
    assert 'route="/v1/embeddings",status="499"' in text and 'status="500"' not in text
