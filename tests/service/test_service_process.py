"""The real server (`litestar run` in a subprocess) driven by the official openai client."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openai
import pytest

from embedrank.testing.launch import REPO, running_server

pytestmark = pytest.mark.slow

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
KEY = "process-test-key"


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    with running_server({"EMBEDRANK_API_KEYS": KEY, "HF_HUB_OFFLINE": "1"}, log_path=str(log)) as url:
        yield url
    assert KEY not in log.read_text(), "the API key must never be written to the log"


def test_openai_client_embeddings(base_url, encoder):
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0)
    texts = ["The quick brown fox.", "Embeddings over HTTP", "Ünïcödé 日本語"]
    ref = encoder.encode(texts)
    default = client.embeddings.create(model=MODEL, input=texts)  # the SDK asks for base64 by default
    explicit = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    for resp in (default, explicit):
        assert resp.model == MODEL and [d.index for d in resp.data] == [0, 1, 2]
        got = np.array([d.embedding for d in resp.data], dtype=np.float32)
        assert np.abs(got - ref).max() < 1e-5
        assert resp.usage.prompt_tokens == resp.usage.total_tokens > 0
    single = client.embeddings.create(model=MODEL, input="just one")
    assert len(single.data) == 1 and len(single.data[0].embedding) == 384
    short = client.embeddings.create(model=MODEL, input=texts, dimensions=128)
    got = np.array([d.embedding for d in short.data], dtype=np.float32)
    assert got.shape == (3, 128)
    np.testing.assert_allclose(got, encoder.encode(texts, dimensions=128), atol=1e-5)


def test_openai_client_errors_are_not_retried(base_url):
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        client.embeddings.create(model="no-such-model", input="x")
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=MODEL, input=[])
    bad = openai.OpenAI(base_url=f"{base_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.embeddings.create(model=MODEL, input="x")


def test_litestar_run_from_the_repo_root_with_litestar_installed_elsewhere(tmp_path):
    """`litestar run` finds the app by its own autodiscovery (app.py), not through a .env that python-dotenv
    looks for upwards from Litestar's installed files: here Litestar is imported from a directory outside
    the repo (a symlink on PYTHONPATH), as from a virtualenv, conda or system Python elsewhere."""
    import os
    import subprocess
    import sys

    import httpx
    import litestar

    outside = tmp_path / "site-packages"
    outside.mkdir()
    (outside / "litestar").symlink_to(Path(litestar.__file__).parent)
    env = {k: v for k, v in os.environ.items() if k != "LITESTAR_APP"}
    env.update({"PYTHONPATH": str(outside), "EMBEDRANK_API_KEYS": KEY, "HF_HUB_OFFLINE": "1"})
    where = subprocess.run(
        [sys.executable, "-c", "import litestar; print(litestar.__file__)"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout
    assert where.startswith(str(outside)), where  # Litestar really comes from outside the repo
    assert not (REPO / ".env").exists()
    with running_server(env, inherit_env=False, log_path=str(tmp_path / "server.log")) as url:
        assert httpx.get(f"{url}/health").status_code == 200
        models = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert models["data"][0]["id"] == MODEL
