"""A store's chunks (:mod:`embedrank.serving.chunking`): a long document tokenized a segment at a time is cut into
the windows the library cuts the whole text into (``split_windows``), with WordPiece, byte-level BPE and Unigram
tokenizers, and chunking stops as soon as the chunks pass their limit."""

from __future__ import annotations

import asyncio
import functools

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from embedrank.models.chunking import split_windows
from embedrank.models.tokens import text_offsets
from embedrank.retrieval.documents import Document
from embedrank.serving import chunking
from embedrank.serving.chunking import TooManyChunksError, chunk_documents, segments
from embedrank.types import Chunking


@functools.cache
def tokenizer(kind: str):
    from transformers import AutoTokenizer

    from embedrank.testing.tiny import tiny_model

    return AutoTokenizer.from_pretrained(
        tiny_model({"wordpiece": "bert", "bpe": "roberta", "unigram": "xlm-roberta"}[kind])
    )


class Served:
    """What chunking asks of a served model, by a real tokenizer; each call's longest text kept."""

    def __init__(self, kind: str) -> None:
        self.tokenizer, self.longest = tokenizer(kind), 0

    async def token_offsets(self, texts, *, input_type=None):
        self.longest = max(self.longest, *(len(t) for t in texts))
        return text_offsets(self.tokenizer, texts)


def library_windows(kind: str, text: str, size: int, overlap: int) -> list[str]:
    offsets = functools.partial(text_offsets, tokenizer(kind))
    return split_windows([text], offsets, window=size, chunking=Chunking(overlap=overlap)).texts


WORDS = ["tea", "leaf", "green", "été", "中文", "x9", "don't", "(a)", "e-mail", "Ω", "naïve", "a"]
texts = st.lists(
    st.tuples(st.sampled_from(WORDS), st.sampled_from([" ", "  ", "\n", "\t", " \n", ", ", ". "])),
    min_size=1,
    max_size=400,
).map(lambda parts: "".join(w + s for w, s in parts).strip())


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts, size=st.integers(3, 40), overlap_share=st.floats(0, 0.5))
@example(  # a word that fills a segment's end, whitespace just past it: the cut is before the word, not in it
    text="tea tea tea leaf, green  été, 中文, 中文, e-mail e-mail  Ω, Ω  e-mail", size=3, overlap_share=0.0
)
def test_a_long_document_tokenized_in_segments_has_the_whole_texts_windows(
    monkeypatch, kind, text, size, overlap_share
):
    overlap = int(size * overlap_share)
    monkeypatch.setattr(chunking, "SEGMENT", 64)  # most texts here are longer: cut into segments
    served = Served(kind)
    got = asyncio.run(chunk_documents(served, [Document(text)], size, overlap))  # type: ignore[arg-type]
    assert [t for t, _ in got] == library_windows(kind, text, size, overlap)
    assert served.longest <= 64


def test_short_and_long_documents_keep_their_owners_and_blank_ones_have_none(monkeypatch):
    monkeypatch.setattr(chunking, "SEGMENT", 50)
    long = " ".join(f"w{i}" for i in range(200))
    docs = [Document("short one"), Document("  "), Document(long), Document("tail")]
    got = asyncio.run(chunk_documents(Served("wordpiece"), docs, 16, 4))  # type: ignore[arg-type]
    owners = [owner for _, owner in got]
    assert owners[0] == 0 and owners[-1] == 3 and set(owners) == {0, 2, 3} and owners == sorted(owners)
    assert [t for t, o in got if o == 2] == library_windows("wordpiece", long, 16, 4)


def test_chunking_stops_as_soon_as_the_chunks_pass_their_limit(monkeypatch):
    monkeypatch.setattr(chunking, "SEGMENT", 50)
    served = Served("wordpiece")
    long = " ".join(f"w{i}" for i in range(5000))
    with pytest.raises(TooManyChunksError, match="more than 10 chunks") as caught:
        asyncio.run(chunk_documents(served, [Document(long)], 8, 0, max_chunks=10))  # type: ignore[arg-type]
    assert caught.value.count == 11
    assert asyncio.run(chunk_documents(served, [Document("a b c")], 8, 0, max_chunks=1))  # type: ignore[arg-type]


def test_segments_end_where_whitespace_begins_else_at_their_size():
    text = "alpha beta  gamma\tdelta " * 50
    parts = list(segments(text, size=100))  # its last tenth, 10 characters, always holds a run's start
    assert "".join(text[a:b] for a, b in parts) == text and all(b - a <= 100 for a, b in parts)
    assert all(text[b].isspace() and not text[b - 1].isspace() for _, b in parts[:-1])
    assert list(segments("x" * 95, size=40)) == [(0, 40), (40, 80), (80, 95)]
