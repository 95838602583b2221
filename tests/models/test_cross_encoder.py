"""Cross-encoder parity with sentence_transformers.CrossEncoder on a locally built model."""

from __future__ import annotations

import numpy as np
import pytest

from embedrank import BiEncoderScorer, CrossEncoder, InvalidInputError, ModelKindError, load_reranker
from embedrank.errors import InputTooLongError

pytestmark = pytest.mark.slow

QUERY = "what causes the seasons on earth"
DOCS = [
    "The tilt of Earth's axis causes the seasons.",
    "",
    "Bananas are rich in potassium. " * 120,  # longer than the 512-token limit once paired
    "Ünïcödé: les saisons sont causées par l'inclinaison de la Terre. 季節",
    "Seasons are caused by the distance from the sun, a common misconception.",
    "Photosynthesis happens in chloroplasts.",
]


@pytest.fixture(scope="module")
def cross_encoder(cross_encoder_dir):
    return CrossEncoder.from_pretrained(cross_encoder_dir)


def test_scores_match_sentence_transformers(cross_encoder, cross_encoder_dir):
    from sentence_transformers import CrossEncoder as STCrossEncoder

    ref_model = STCrossEncoder(cross_encoder_dir, device="cpu")
    pairs = [(QUERY, d) for d in DOCS]
    ref = ref_model.predict(pairs, batch_size=4)
    ours = cross_encoder.score(QUERY, DOCS, batch_size=4)
    assert np.abs(ours - ref).max() < 1e-5
    assert np.abs(cross_encoder.score_pairs(pairs) - ref).max() < 1e-5
    # Ranking identical to sentence-transformers' own.
    ref_rank = [r["corpus_id"] for r in ref_model.rank(QUERY, DOCS)]
    assert cross_encoder.rank(QUERY, DOCS)["index"].tolist() == ref_rank
    # Raw logits option matches sentence-transformers with an identity activation.
    import torch

    raw_ref = ref_model.predict(pairs, activation_fn=torch.nn.Identity())
    assert np.abs(cross_encoder.score(QUERY, DOCS, apply_activation=False) - raw_ref).max() < 1e-5


def test_rank_top_k_and_ties(cross_encoder, monkeypatch):
    ranked = cross_encoder.rank(QUERY, DOCS, top_k=2)
    assert list(ranked.columns) == ["index", "score", "text"]
    assert len(ranked) == 2
    assert ranked["score"].is_monotonic_decreasing
    # Exact ties (forced, since float noise decides real ones) break by input index.
    monkeypatch.setattr(cross_encoder, "score", lambda q, d, **_: np.array([0.5, 0.9, 0.5, 0.5], dtype=np.float32))
    assert cross_encoder.rank(QUERY, ["a", "b", "c", "d"])["index"].tolist() == [1, 0, 2, 3]


def test_token_stats(cross_encoder):
    out = cross_encoder.score_pairs_with_stats([(QUERY, d) for d in DOCS])
    assert out.truncated == [False, False, True, False, False, False]
    assert out.token_counts[2] == cross_encoder.max_seq_length
    assert out.scores.shape == (6,)
    full = cross_encoder.count_tokens([QUERY] * len(DOCS), DOCS)
    assert [min(n, cross_encoder.max_seq_length) for n in full] == out.token_counts
    # batches are formed by token length, but errors name the pair's position in the input
    with pytest.raises(InputTooLongError, match=r"pairs\[2\] "):
        cross_encoder.score_pairs_with_stats([(QUERY, d) for d in DOCS], batch_size=2, truncate=False)


def test_errors(cross_encoder, model_path):
    with pytest.raises(InvalidInputError, match="empty"):
        cross_encoder.score(QUERY, [])
    with pytest.raises(ModelKindError, match="embedding model"):
        CrossEncoder.from_pretrained(model_path)
    with pytest.raises(InvalidInputError):
        cross_encoder.rank(QUERY, DOCS, top_k=0)
    with pytest.raises(InvalidInputError, match="batch_size"):
        cross_encoder.score(QUERY, DOCS, batch_size=0)


def test_load_reranker_detects_kind(cross_encoder_dir):
    assert load_reranker(cross_encoder_dir).kind == "cross-encoder"
    scorer = load_reranker("sentence-transformers/all-MiniLM-L6-v2")
    assert isinstance(scorer, BiEncoderScorer) and scorer.kind == "bi-encoder"
    s = scorer.score(QUERY, DOCS[:2])
    assert s.shape == (2,) and s[0] > s[1]


def test_a_bi_encoder_scorer_encodes_a_document_once_across_queries_and_scores_as_without_its_cache(
    encoder, monkeypatch
):
    encoded: list[list[str]] = []
    real = encoder.encode

    def counting(texts, **kwargs):
        encoded.append(list(texts))
        return real(texts, **kwargs)

    monkeypatch.setattr(encoder, "encode", counting)
    scorer, plain = BiEncoderScorer(encoder, cache_size=3), BiEncoderScorer(encoder, cache_size=0)
    a, b, c, d = DOCS[0], DOCS[3], DOCS[4], DOCS[5]
    for query, docs in (("q one", [a, b, a]), ("q two", [b, c]), ("q three", [d]), ("q four", [a, c])):
        np.testing.assert_allclose(scorer.score(query, docs), plain.score(query, docs), atol=1e-5)
    ours = encoded[0::2]  # the calls alternate: the cached scorer's, then the plain one's
    assert [texts[1:] for texts in ours] == [[a, b], [c], [d], [a]]  # a was the least recent when d came
    assert [texts[1:] for texts in encoded[1::2]] == [[a, b], [b, c], [d], [a, c]]  # without a cache: each call's own
