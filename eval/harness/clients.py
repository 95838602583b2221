"""HTTP clients of a benchmark's server: the key every benchmark's server accepts, the model it serves by
default, and an async client that times one request."""

from __future__ import annotations

import time

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
KEY = "bench-key"


def http_client(base: str):
    import httpx

    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    return httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=1800, limits=limits)


async def post(client, route: str, body: dict) -> float:
    start = time.perf_counter()
    resp = await client.post(route, json=body)
    resp.raise_for_status()
    return time.perf_counter() - start
