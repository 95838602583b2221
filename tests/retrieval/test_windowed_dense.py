"""The windowed dense first stage (MaxP): every window of a long document embedded and indexed, a document
scored by its best window; checked against scoring every window by hand."""

from __future__ import annotations

import numpy as np
import pytest

from embedrank import DenseRetriever, EmbeddingCache, Encoder
from embedrank.errors import InvalidInputError
from embedrank.models.chunking import Chunking, split_windows
from embedrank.retrieval.bm25 import BM25Retriever
from embedrank.retrieval.data import DEMO_CORPUS, DEMO_QUERIES, doc_text
from embedrank.retrieval.dense import WindowedDenseRetriever, corpus_windows
from embedrank.retrieval.stages import HybridRetriever, MaxPRetriever

pytestmark = pytest.mark.slow  # the packaged MiniLM


@pytest.fixture(scope="module")
def short_encoder():
    return Encoder.from_pretrained(max_seq_length=16)  # 14 text tokens a window: the demo documents split


def by_hand(encoder, corpus, queries, overlap=None):
    """Each query's score for each document: the maximum over its windows, every window encoded alone."""
    ids = list(corpus)
    chunking = Chunking(overlap=overlap)
    windows = split_windows(
        [doc_text(corpus[d]) for d in ids], encoder.token_offsets, window=encoder.chunk_window(), chunking=chunking
    )
    scores = encoder.encode_query(list(queries.values())) @ encoder.encode_document(windows.texts).T
    best = np.full((len(queries), len(ids)), -np.inf)
    for j, owner in enumerate(windows.owners):
        best[:, owner] = np.maximum(best[:, owner], scores[:, j])
    return {q: dict(zip(ids, best[i].tolist(), strict=True)) for i, q in enumerate(queries)}, windows


def test_documents_score_as_their_best_window(short_encoder, tmp_path):
    oracle, windows = by_hand(short_encoder, DEMO_CORPUS, DEMO_QUERIES)
    assert windows.chunked >= 3  # the test means something: several documents are split
    retriever = WindowedDenseRetriever.from_corpus(short_encoder, DEMO_CORPUS, cache=EmbeddingCache(tmp_path))
    for k in (1, 3, len(DEMO_CORPUS)):
        run = retriever.retrieve(DEMO_QUERIES, k)
        for q, docs in run.items():
            expected = sorted(oracle[q].items(), key=lambda item: -item[1])[:k]
            assert list(docs) == [d for d, _ in expected]
            np.testing.assert_allclose(list(docs.values()), [s for _, s in expected], atol=1e-5)


def test_short_documents_score_as_the_plain_dense_stage(tmp_path):
    encoder = Encoder.from_pretrained()  # 256 tokens: every demo document fits one window
    plain = DenseRetriever.from_corpus(encoder, DEMO_CORPUS, cache=False).retrieve(DEMO_QUERIES, 3)
    windowed = WindowedDenseRetriever.from_corpus(encoder, DEMO_CORPUS, cache=False).retrieve(DEMO_QUERIES, 3)
    for q in DEMO_QUERIES:
        assert list(windowed[q]) == list(plain[q])
        np.testing.assert_allclose(list(windowed[q].values()), list(plain[q].values()), atol=1e-6)


def test_window_vectors_go_through_the_cache(short_encoder, tmp_path):
    cache = EmbeddingCache(tmp_path)
    first = WindowedDenseRetriever.from_corpus(short_encoder, DEMO_CORPUS, cache=cache)
    second = WindowedDenseRetriever.from_corpus(short_encoder, DEMO_CORPUS, cache=cache)
    assert (first.corpus_embeddings.cache, second.corpus_embeddings.cache) == ("miss", "hit")
    assert len(first.owners) > len(DEMO_CORPUS)


def test_only_the_best_window_can_rank_a_document(short_encoder):
    with pytest.raises(InvalidInputError, match="aggregate must be 'max'"):
        WindowedDenseRetriever.from_corpus(short_encoder, DEMO_CORPUS, chunking=Chunking(aggregate="mean"), cache=False)


def test_the_search_deepens_when_one_document_fills_the_top_windows(short_encoder, monkeypatch):
    corpus = {
        "long": {"text": "Green tea and its health benefits. " * 12},  # many windows, all about the query
        "tea": {"text": "Black tea is brewed from oxidized leaves."},
        "cars": {"text": "Electric cars need charging stations."},
    }
    queries = {"q": "health benefits of green tea"}
    oracle, windows = by_hand(short_encoder, corpus, queries)
    assert (windows.owners == 0).sum() >= 8  # the top 2k = 4 windows are all the long document's
    retriever = WindowedDenseRetriever.from_corpus(short_encoder, corpus, cache=False)
    depths, search = [], retriever.windows.index.search
    monkeypatch.setattr(retriever.windows.index, "search", lambda v, k: depths.append(k) or search(v, k))
    run = retriever.retrieve(queries, 2)
    assert depths[0] == 4 and len(depths) > 1  # the first 4 windows named one document: it searched deeper
    expected = sorted(oracle["q"].items(), key=lambda item: -item[1])[:2]
    assert list(run["q"]) == [d for d, _ in expected] and expected[0][0] == "long"
    np.testing.assert_allclose(list(run["q"].values()), [s for _, s in expected], atol=1e-5)


def test_bm25_over_windows_scores_a_document_by_its_best_window(short_encoder):
    """Any stage over the windows (here BM25) through MaxPRetriever: each document's best window among every
    window scored, deepening as the dense stage does."""
    corpus = {
        "long": {"text": "Green tea and its health benefits. " * 12},
        "tea": {"text": "Black tea is brewed from oxidized leaves, and green tea from unoxidized ones."},
        "cars": {"text": "Electric cars need charging stations."},
    }
    queries = {"q": "health benefits of green tea", "r": "charging electric cars"}
    windows, owners = corpus_windows(short_encoder, corpus)
    assert owners.count("long") >= 8 and len(windows) == len(owners)
    lexical = BM25Retriever.from_corpus(windows)
    every = lexical.retrieve(queries, len(windows))  # every window that shares a term, scored
    oracle: dict[str, dict[str, float]] = {q: {} for q in queries}
    for q, hits in every.items():
        for window, score in hits.items():
            doc = owners[int(window)]
            oracle[q][doc] = max(score, oracle[q].get(doc, score))
    run = MaxPRetriever(lexical, owners).retrieve(queries, 2)
    for q in queries:
        expected = sorted(oracle[q].items(), key=lambda item: -item[1])[:2]
        assert list(run[q]) == [d for d, _ in expected]
        np.testing.assert_allclose(list(run[q].values()), [s for _, s in expected])


def test_a_fusion_over_windows_is_read_at_its_own_depth(short_encoder):
    """A hybrid over windows fuses each window's scores at its stages' depth, however many documents are asked
    for: deeper reads would normalize the scores differently."""
    windows, owners = corpus_windows(short_encoder, DEMO_CORPUS)
    lexical = BM25Retriever.from_corpus(windows)
    dense = DenseRetriever.from_corpus(short_encoder, windows, cache=False)
    fusion = HybridRetriever(dense, lexical, depth=3)
    asked: list[int] = []
    retrieve = fusion.retrieve
    fusion.retrieve = lambda queries, k: asked.append(k) or retrieve(queries, k)  # type: ignore[method-assign]
    run = MaxPRetriever(fusion, owners).retrieve(DEMO_QUERIES, len(DEMO_CORPUS))
    assert asked and max(asked) <= 3
    fused = retrieve(DEMO_QUERIES, 3)
    for q, docs in run.items():
        best: dict[str, float] = {}
        for window, score in fused[q].items():
            best[owners[int(window)]] = max(score, best.get(owners[int(window)], score))
        assert docs == pytest.approx(best)
