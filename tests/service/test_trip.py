"""The texts' trip through the code: which modules one ``/v1/embeddings`` request's texts pass through, file by
file, measured by following the texts (and the token rows they become) from the body to the forward pass, and
the vectors back, on the packaged model; ``docs/design.md`` shows the trip this measures."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from litestar.testing import TestClient

from embedrank.models.tokens import TokenRow
from embedrank.types import ModelOutput

ROOT = Path(__file__).resolve().parents[2]
MARK = "zqx"  # a word only the request's text holds
LAYERS = ("service/", "embedrank/serving/", "embedrank/models/", "embedrank/runtime/", "embedrank/math/")
"""The layers from the top: a stop in a higher layer than the stop before it is a climb."""
SHARED = ("embedrank/types.py",)
"""The shared value types: reading the carried object (its token total) is no stop of its own."""


def _carries(value: Any, *, texts: bool, depth: int = 0) -> bool:
    """Whether ``value`` is the request's text or holds it: its bytes, the text, its token rows; with
    ``texts=False``, what comes back instead: the model's output and its vectors."""
    if texts:
        if isinstance(value, str):
            return MARK in value
        if isinstance(value, bytes | bytearray):
            return MARK.encode() in value
        if isinstance(value, TokenRow):
            return True
    elif isinstance(value, ModelOutput | np.ndarray):
        return True
    if depth < 2 and isinstance(value, list | tuple) and value:
        return any(_carries(v, texts=texts, depth=depth + 1) for v in value[:4])
    if depth < 2 and hasattr(value, "__struct_fields__"):
        return any(_carries(getattr(value, f, None), texts=texts, depth=depth + 1) for f in value.__struct_fields__)
    return False


def layer(path: str) -> int:
    return next((i for i, prefix in enumerate(LAYERS) if path.startswith(prefix)), len(LAYERS))


def stops(calls: list[tuple[str, str]]) -> list[tuple[str, str, bool]]:
    """Consecutive calls in one file as one stop: ``(file, first function, climbed)``, climbed when the stop
    is in a higher layer than the one before."""
    out: list[tuple[str, str, bool]] = []
    for path, name in calls:
        if out and out[-1][0] == path:
            continue
        out.append((path, name, bool(out) and layer(path) < layer(out[-1][0])))
    return out


def trace_request(texts: bool) -> list[tuple[str, str]]:
    """The calls of embedrank's and the service's own code that receive the texts of one ``/v1/embeddings``
    request (``texts=False``: its output), in order, each function's frame once (a coroutine that resumes is
    not entered again)."""
    from embedrank import Encoder
    from service.app import create_app
    from service.settings import Auth, Cache, Engine, Settings

    encoder = Encoder.from_pretrained(backend="torch")
    settings = Settings(
        auth=Auth(api_keys=("k",)), engine=Engine(tune_malloc=False), cache=Cache(embedding_cache_bytes=0)
    )
    app = create_app(settings, wait_for_models=True, models={"m": encoder})
    calls: list[tuple[str, str]] = []
    seen: list[Any] = []  # the frames entered (kept, so that no later frame reuses an id)
    on = False

    def profile(frame: Any, event: str, arg: Any) -> None:
        if not on or event != "call" or frame in seen:
            return
        path = frame.f_code.co_filename.removeprefix(f"{ROOT}/")
        if not path.startswith(("service/", "embedrank/")) or path.startswith(SHARED):
            return
        code = frame.f_code
        named = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(_carries(frame.f_locals.get(name), texts=texts) for name in named):
            seen.append(frame)
            calls.append((path, code.co_name))

    body = {"model": "m", "input": [f"The tilt of the axis gives the seasons {MARK}. " * 3]}
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        with TestClient(app) as client:
            client.headers["Authorization"] = "Bearer k"
            assert client.post("/v1/embeddings", json=body).status_code == 200  # the first: warm-up
            on = True
            answered = client.post("/v1/embeddings", json=body)
            on = False
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert answered.status_code == 200, answered.text
    return calls


def rendered(trip: list[tuple[str, str, bool]]) -> str:
    return "\n".join(f"{path:34s} {name}{'  (climb)' if climbed else ''}".rstrip() for path, name, climbed in trip)


@pytest.fixture(scope="module")
def trips() -> dict[str, list[tuple[str, str, bool]]]:
    return {"in": stops(trace_request(texts=True)), "back": stops(trace_request(texts=False))}


def test_the_texts_make_at_most_13_stops_and_2_climbs_on_their_way_in(trips):
    way_in = trips["in"]
    assert way_in[0][0] == "service/decoding.py" and way_in[-1][0] == "embedrank/models/tokens.py", rendered(way_in)
    assert len(way_in) <= 13 and sum(c for *_, c in way_in) <= 2, rendered(way_in)


def test_the_design_notes_show_the_measured_trip(trips):
    """docs/design.md shows both ways as measured here (regenerate its blocks from this test's message)."""
    page = (ROOT / "docs" / "design.md").read_text()
    for way in ("in", "back"):
        shown = re.search(rf"<!-- trip-{way} -->\n```text\n(.*?)\n```", page, flags=re.S)
        assert shown is not None and shown[1] == rendered(trips[way]), f"trip-{way}:\n{rendered(trips[way])}"
