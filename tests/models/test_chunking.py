"""Long documents chunked for reranking: the windows, the aggregation (against a plain loop), and the
evidence that a relevant sentence past token 256 is found with chunking and missed without."""

from __future__ import annotations

import re

import numpy as np
import pytest

from embedrank.errors import InvalidInputError, RequestTooLargeError
from embedrank.math.chunks import aggregate_window_scores
from embedrank.models.chunking import Chunking, split_windows, window_starts
from embedrank.models.scorers import BiEncoderScorer

FILLER = [
    "The community garden opens at eight every Saturday morning.",
    "Volunteers bring tomatoes, basil and fresh bread to share.",
    "Children paint the wooden fences in bright colours each spring.",
    "The local council repaired the old greenhouse roof last year.",
]
ANSWER = "Liquid nitrogen boils at minus 196 degrees Celsius at normal atmospheric pressure."
QUERY = "At what temperature does liquid nitrogen boil?"
OTHERS = ["Nitrogen makes up most of the air we breathe.", "Helium is used to fill party balloons."]


def words(texts):
    return [[(m.start(), m.end()) for m in re.finditer(r"\S+", t)] for t in texts]


@pytest.fixture(scope="module")
def long_document(encoder):
    """Filler past the model's 256 tokens, then the only sentence that answers the query."""
    text, i = "", 0
    while encoder.count_tokens([text])[0] < encoder.max_seq_length + 2:
        text, i = text + FILLER[i % len(FILLER)] + " ", i + 1
    return text + ANSWER


@pytest.mark.parametrize("how", ["max", "mean", "first"])
def test_aggregation_equals_a_plain_loop(how):
    rng = np.random.default_rng(0)
    owners = np.sort(rng.integers(0, 20, size=200))
    owners[:20] = np.arange(20)  # every document owns a window
    owners.sort()
    scores = rng.normal(size=200)
    got = aggregate_window_scores(scores, owners, 20, how)
    per_doc = [scores[owners == d] for d in range(20)]
    expected = {
        "max": [s.max() for s in per_doc],
        "mean": [s.mean() for s in per_doc],
        "first": [s[0] for s in per_doc],
    }
    np.testing.assert_allclose(got, expected[how], rtol=1e-6)


def test_best_window_of_each_row_equals_a_plain_loop():
    from embedrank.math.chunks import best_window_rows

    rng = np.random.default_rng(1)
    owners = np.sort(np.concatenate([np.arange(20), rng.integers(0, 20, size=100)]))  # each document has a window
    windows, queries = rng.normal(size=(len(owners), 8)), rng.normal(size=(50, 8))
    documents = rng.integers(0, 20, size=50)
    expected = [
        int(np.flatnonzero(owners == d)[np.argmax(windows[owners == d] @ q)])
        for q, d in zip(queries, documents, strict=True)
    ]
    assert best_window_rows(queries, windows, owners, documents).tolist() == expected
    with pytest.raises(ValueError, match="own at least one window"):
        best_window_rows(queries[:1], windows, owners, np.array([25]))


def test_windows_overlap_cover_the_text_and_respect_the_bounds():
    doc = " ".join(f"w{i}" for i in range(10))
    w = split_windows([doc], words, window=4, chunking=Chunking(overlap=1))
    assert w.texts == ["w0 w1 w2 w3", "w3 w4 w5 w6", "w6 w7 w8 w9"] and w.chunked == 1 and w.cut == [False]
    capped = split_windows([doc], words, window=4, chunking=Chunking(overlap=1, max_chunks=2))
    assert capped.texts == ["w0 w1 w2 w3", "w3 w4 w5 w6"] and capped.cut == [True]
    short = split_windows([doc], words, window=4, chunking=Chunking(overlap=0, max_tokens=6))
    assert short.texts == ["w0 w1 w2 w3", "w4 w5"] and short.cut == [True]


def test_the_overlap_is_at_most_half_the_window_so_work_at_most_doubles():
    doc = " ".join(f"w{i}" for i in range(1000))
    default = split_windows([doc], words, window=8, chunking=Chunking())  # 32 > 8 // 2: half the window
    assert len(default.texts) == len(window_starts(1000, 8, 4)) and default.texts[1].startswith("w4 ")
    half = split_windows([doc], words, window=8, chunking=Chunking(overlap=4))
    assert sum(len(t.split()) for t in half.texts) <= 2 * 1000 + 8
    for too_large in (5, 2**31 - 1):
        with pytest.raises(InvalidInputError, match="more than half the window of 8 tokens") as info:
            split_windows([doc], words, window=8, chunking=Chunking(overlap=too_large))
        assert info.value.param == "overlap"


def test_a_budget_stops_the_split_before_the_rest_is_tokenized():
    docs = [" ".join(f"w{i}" for i in range(100))] * 1000  # 100,000 tokens
    seen = []

    def counting(texts):
        seen.append(len(texts))
        return words(texts)

    with pytest.raises(RequestTooLargeError, match="the limit is 5000 per request"):
        split_windows(docs, counting, window=16, chunking=Chunking(overlap=0), budget=5000)
    assert sum(seen) <= 64  # two slices of 32 texts were tokenized, not 1,000
    assert len(split_windows(docs[:10], words, window=16, chunking=Chunking(), budget=5000).texts) > 10


@pytest.mark.parametrize(
    ("field", "value"), [("max_chunks", 0), ("max_tokens", -1), ("overlap", -1), ("aggregate", "median"), ("window", 0)]
)
def test_bad_chunking_settings_name_the_field(field, value):
    with pytest.raises(InvalidInputError) as info:
        Chunking(**{field: value})
    assert info.value.param == field


def test_relevant_sentence_after_token_256_is_found_only_with_chunking(encoder, long_document):
    assert encoder.count_tokens([long_document])[0] > encoder.max_seq_length
    docs = [long_document, *OTHERS]
    truncated = BiEncoderScorer(encoder).score(QUERY, docs)
    chunked = BiEncoderScorer(encoder, chunking=Chunking()).score(QUERY, docs)
    assert int(np.argmax(chunked)) == 0  # the long document ranks first with chunking...
    assert int(np.argmin(truncated)) == 0  # ...and last without: its first 256 tokens are about a garden
    np.testing.assert_allclose(chunked[1:], truncated[1:], atol=1e-6)  # short documents are scored as before
    first = BiEncoderScorer(encoder, chunking=Chunking(aggregate="first")).score(QUERY, docs)
    np.testing.assert_allclose(first, truncated, atol=1e-5)  # "first" is what truncation scores


def test_chunked_cross_encoder_equals_sentence_transformers_on_the_windows(cross_encoder_dir, long_document):
    from sentence_transformers import CrossEncoder as STCrossEncoder

    from embedrank import CrossEncoder

    ours = CrossEncoder.from_pretrained(cross_encoder_dir, max_seq_length=128)  # the config allows 512
    ref_model = STCrossEncoder(cross_encoder_dir, device="cpu")
    docs = [long_document, *OTHERS]
    chunking = Chunking(overlap=16)
    windows = split_windows(docs, ours.token_offsets, window=ours.chunk_window(QUERY), chunking=chunking)
    assert windows.chunked == 1 and len(windows.texts) >= 4
    ref_windows = ref_model.predict([(QUERY, t) for t in windows.texts])
    expected = aggregate_window_scores(ref_windows, windows.owners, len(docs), "max")
    np.testing.assert_allclose(ours.score(QUERY, docs, chunking=chunking), expected, atol=1e-5)
    ranked = ours.rank(QUERY, docs, chunking=chunking)
    np.testing.assert_allclose(ranked["score"], sorted(expected.tolist(), reverse=True), atol=1e-5)


def test_one_chunk_plan_refuses_cut_text_when_truncation_is_off(encoder):
    from embedrank.errors import InputTooLongError
    from embedrank.models.chunking import ChunkPlan

    long_text = "The community garden opens at eight. " * 80
    bounded = Chunking(max_chunks=1)
    with pytest.raises(InputTooLongError, match=r"texts\[1\] is longer than the chunking bounds allow") as info:
        encoder.encode_with_stats(["short", long_text], chunking=bounded, truncate=False)
    assert info.value.param == "texts"
    kept = encoder.encode_with_stats(["short", long_text], chunking=bounded)  # truncation on: cut, and said so
    assert kept.truncated == [False, True]
    plan = ChunkPlan.make(["a b c d e f"], lambda ts: [[(2 * i, 2 * i + 1) for i in range(6)] for _ in ts], window=4,
                          chunking=Chunking(overlap=2))  # fmt: skip
    assert plan.texts == ["a b c d", "c d e f"]
    assert plan.scores(np.array([0.1, 0.7]), [6, 6], [False, False]).values.tolist() == pytest.approx([0.7])
