"""Compact indexes: binary with rescoring against sentence-transformers and a numpy
reference, and the 8-bit scalar quantizer against exact search."""

from __future__ import annotations

import numpy as np
import pytest
from sentence_transformers.util import quantize_embeddings
from sentence_transformers.util.quantization import semantic_search_faiss

from embedrank.errors import InvalidInputError
from embedrank.math.quantization import dequantize, quantization_ranges, quantize
from embedrank.math.similarity import l2_normalize
from embedrank.retrieval.binary_index import BinaryIndex
from embedrank.retrieval.index import build_index, load_index, recall_at_k


def _data(n=400, q=12, d=64, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(20, d))
    corpus = l2_normalize((centers[rng.integers(0, 20, n)] + 0.6 * rng.normal(size=(n, d))).astype(np.float32))
    queries = l2_normalize((centers[rng.integers(0, 20, q)] + 0.6 * rng.normal(size=(q, d))).astype(np.float32))
    return corpus, queries, [f"d{i}" for i in range(n)]


def test_bits_rescoring_equals_sentence_transformers():
    corpus, queries, ids = _data()
    index = build_index(64, kind="binary", rescore="bits", rescore_multiplier=3)
    index.add(ids, corpus)
    _, ours = index.search(queries, 10)
    hits, _ = semantic_search_faiss(
        queries,
        corpus_embeddings=quantize_embeddings(corpus, precision="ubinary"),
        corpus_precision="ubinary",
        top_k=10,
        rescore_multiplier=3,
        exact=True,
    )
    assert ours == [[ids[h["corpus_id"]] for h in row] for row in hits]


def test_int8_rescoring_equals_a_numpy_reference():
    corpus, queries, ids = _data(seed=1)
    index = build_index(64, kind="binary", rescore_multiplier=4)
    index.add(ids, corpus)
    scores, found = index.search(queries, 10)
    bits = np.unpackbits(quantize(corpus, "ubinary"), axis=1)  # (N, 64)
    ranges = quantization_ranges(corpus)
    stored = dequantize(quantize(corpus, "int8", ranges), "int8", ranges)
    for qi, query in enumerate(queries):
        hamming = (bits != (query > 0)).sum(axis=1)
        candidates = np.argsort(hamming, kind="stable")[:40]
        rescored = stored[candidates] @ query
        best = candidates[np.argsort(-rescored, kind="stable")[:10]]
        assert found[qi] == [ids[i] for i in best]
        np.testing.assert_allclose(scores[qi], np.sort(rescored)[::-1][:10], rtol=1e-5)


def test_rescoring_recovers_recall_and_sizes_are_as_documented():
    corpus, queries, ids = _data(n=2000, q=50, d=128, seed=2)
    exact = build_index(128, kind="flat")
    exact.add(ids, corpus)
    truth = exact.search(queries, 10)[1]
    recalls = {}
    for rescore in ("none", "bits", "int8"):
        index = build_index(128, kind="binary", rescore=rescore)
        index.add(ids, corpus)
        recalls[rescore] = recall_at_k(index.search(queries, 10)[1], truth)
        assert index.bytes_per_vector == 16 + (128 if rescore == "int8" else 0)
    assert recalls["none"] < recalls["bits"] < recalls["int8"]
    deeper = build_index(128, kind="binary", rescore_multiplier=10)  # more candidates: int8 finds nearly all
    deeper.add(ids, corpus)
    assert recall_at_k(deeper.search(queries, 10)[1], truth) > 0.95
    sq8 = build_index(128, kind="sq8")
    sq8.add(ids, corpus)
    assert recall_at_k(sq8.search(queries, 10)[1], truth) > 0.95
    assert sq8.bytes_per_vector < 128 + 8 and not sq8.can_reconstruct


def test_save_load_roundtrip(tmp_path):
    corpus, queries, ids = _data(seed=3)
    for rescore in ("int8", "bits"):
        index = build_index(64, kind="binary", rescore=rescore, model_id="m")
        index.add(ids[:300], corpus[:300])
        index.add(ids[300:], corpus[300:])  # a second add reuses the first add's ranges
        loaded = load_index(index.save(tmp_path / rescore), model_id="m")
        assert isinstance(loaded, BinaryIndex) and len(loaded) == len(ids)
        for a, b in zip(index.search(queries, 5), loaded.search(queries, 5), strict=True):
            assert [np.asarray(x).tolist() for x in a] == [np.asarray(x).tolist() for x in b]


def test_bad_configurations_and_edge_cases():
    with pytest.raises(InvalidInputError, match="not l2"):
        build_index(8, kind="binary", metric="l2")
    with pytest.raises(InvalidInputError, match="rescore must be one of"):
        build_index(8, kind="binary", rescore="float")
    index = build_index(12, kind="binary")  # 12 dims: bits pad to 2 bytes
    empty_scores, empty_ids = index.search(np.ones((1, 12)), 3)
    assert empty_ids == [[]] and empty_scores[0].shape == (0,)
    with pytest.raises(InvalidInputError, match=">= 2 vectors"):
        index.add(["a"], np.ones((1, 12)))
    index.add(["a", "b", "c"], np.eye(12)[:3] - 0.01)
    _scores, found = index.search(np.eye(12)[:1], 5)
    assert found[0][0] == "a" and len(found[0]) == 3 and not index.can_reconstruct
