"""Retrieve-then-rerank on the demo collection with the real packaged model: stored vectors reused by a
bi-encoder reranker, the same-model warning, the embedding cache's hit/miss report, timings."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from embedrank import (
    BiEncoderScorer,
    BM25Retriever,
    DenseRetriever,
    EmbeddingCache,
    HybridRetriever,
    IndexConfig,
    RetrieveRerank,
)
from embedrank.retrieval.data import DEMO_CORPUS, DEMO_QUERIES, doc_text

pytestmark = pytest.mark.slow


class Counting:
    """Wraps an encoder's ``encode`` and counts the texts it was asked to encode."""

    def __init__(self, encoder, monkeypatch) -> None:
        self.texts = 0
        real = encoder.encode

        def encode(texts, **kwargs):
            texts = list(texts)
            self.texts += len(texts)
            return real(texts, **kwargs)

        monkeypatch.setattr(encoder, "encode", encode)


@pytest.fixture
def dense(encoder, tmp_path):
    return DenseRetriever.from_corpus(encoder, DEMO_CORPUS, cache=EmbeddingCache(tmp_path))


def test_cache_reports_miss_then_hit(encoder, tmp_path):
    cache = EmbeddingCache(tmp_path)
    first = DenseRetriever.from_corpus(encoder, DEMO_CORPUS, cache=cache).corpus_embeddings
    second = DenseRetriever.from_corpus(encoder, DEMO_CORPUS, cache=cache).corpus_embeddings
    assert (first.cache, second.cache) == ("miss", "hit") and first.path == second.path
    assert "embedding cache: hit (" in second.describe()
    np.testing.assert_array_equal(first.vectors, second.vectors)
    off = DenseRetriever.from_corpus(encoder, DEMO_CORPUS, cache=False).corpus_embeddings
    assert off.cache == "off" and off.path is None


def test_bi_encoder_on_its_own_dense_stage_warns(dense, encoder):
    with pytest.warns(UserWarning, match="cannot change"):
        pipeline = RetrieveRerank(dense, DEMO_CORPUS, reranker=BiEncoderScorer(encoder), k_retrieve=5)
    result = pipeline.run(DEMO_QUERIES)
    for qid in DEMO_QUERIES:
        assert list(result.run[qid]) == list(result.first_stage_run[qid])  # same order, as the warning says


def test_hybrid_rerank_reuses_the_index_vectors(dense, encoder, monkeypatch):
    fresh = DenseRetriever(encoder, dense.index)  # its own, so no other test's queries are remembered
    hybrid = HybridRetriever(fresh, BM25Retriever.from_corpus(DEMO_CORPUS))
    scorer = BiEncoderScorer(encoder)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no same-model warning: BM25 candidates can move
        pipeline = RetrieveRerank(hybrid, DEMO_CORPUS, reranker=scorer, k_retrieve=6)
    assert pipeline.vectors_from_index
    counter = Counting(encoder, monkeypatch)
    result = pipeline.run(DEMO_QUERIES)
    # the dense first stage encodes the 6 queries; the rerank reuses their vectors and encodes no document
    assert counter.texts == len(DEMO_QUERIES)
    for qid, docs in result.run.items():
        ids = list(docs)
        expected = scorer.score(DEMO_QUERIES[qid], [doc_text(DEMO_CORPUS[d]) for d in ids])
        np.testing.assert_allclose([docs[d] for d in ids], expected, atol=1e-5)
    assert 0 <= result.timings["first_stage_s"] <= result.timings["total_s"]
    assert result.timings["rerank_s"] <= result.timings["total_s"]


def test_compressed_index_falls_back_to_encoding_the_documents(encoder, tmp_path, monkeypatch):
    corpus = {f"{d}-{i}": doc for i in range(30) for d, doc in DEMO_CORPUS.items()}  # enough to train PQ
    pq = DenseRetriever.from_corpus(
        encoder, corpus, index=IndexConfig(kind="pq", nlist=4), cache=EmbeddingCache(tmp_path)
    )
    hybrid = HybridRetriever(pq, BM25Retriever.from_corpus(corpus))
    pipeline = RetrieveRerank(hybrid, corpus, reranker=BiEncoderScorer(encoder), k_retrieve=3)
    assert not pipeline.vectors_from_index  # PQ codes are not the stored vectors
    counter = Counting(encoder, monkeypatch)
    result = pipeline.run({"q1": DEMO_QUERIES["q1"]})
    assert len(result.run["q1"]) == 3
    distinct = {doc_text(corpus[d]) for d in result.run["q1"]}  # the corpus repeats each text 30 times
    assert counter.texts == 1 + 1 + len(distinct)  # dense query, then the query and its documents from their text


def test_bm25_first_stage_reranked_by_text(encoder):
    scorer = BiEncoderScorer(encoder)
    pipeline = RetrieveRerank(BM25Retriever.from_corpus(DEMO_CORPUS), DEMO_CORPUS, reranker=scorer, k_retrieve=4)
    assert not pipeline.vectors_from_index
    result = pipeline.run(DEMO_QUERIES, show_progress=False)
    assert set(result.timings) == {"first_stage_s", "rerank_s", "total_s"}
    frame = result.to_frame(DEMO_QUERIES, DEMO_CORPUS)
    assert {"query_id", "rank", "doc_id", "score", "first_stage_rank", "query", "text"} <= set(frame.columns)
