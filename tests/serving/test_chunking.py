"""A store's chunks (:mod:`embedrank.serving.chunking`): a long document tokenized a segment at a time is cut into
the windows the library cuts the whole text into (``split_windows``), with WordPiece, byte-level BPE and Unigram
tokenizers, and chunking stops as soon as the chunks pass their limit."""

from __future__ import annotations

import asyncio
import functools
import re
import tracemalloc

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from embedrank.models.chunking import split_windows
from embedrank.models.tokens import text_offsets
from embedrank.retrieval.documents import Document, Piece
from embedrank.serving import chunking
from embedrank.serving.chunking import TooManyChunksError, chunk_documents, pieces_of, segments
from embedrank.types import Chunking


@functools.cache
def tokenizer(kind: str):
    from transformers import AutoTokenizer

    from embedrank.testing.tiny import tiny_model

    return AutoTokenizer.from_pretrained(
        tiny_model({"wordpiece": "bert", "bpe": "roberta", "unigram": "xlm-roberta"}[kind])
    )


def chunked(served, docs, size, overlap, **options) -> list:
    """Every chunk of ``docs`` (documents, or their pieces), as (text, attributes)."""

    async def run():
        given = pieces_of(docs) if docs and isinstance(docs[0], Document) else docs
        return [c async for c in chunk_documents(served, given, size, overlap, **options)]

    return asyncio.run(run())


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
    expected = library_windows(kind, text, size, overlap)
    assert [t for t, _ in chunked(served, [Document(text)], size, overlap)] == expected
    assert served.longest <= 64
    # the same text arriving in pieces of every size cuts the same windows
    for piece in (1, 7, 64, 65, 200):
        parts = [text[i : i + piece] for i in range(0, len(text), piece)] or [""]
        given = [Piece(p, i == 0, i == len(parts) - 1, {}) for i, p in enumerate(parts)]
        assert [t for t, _ in chunked(served, given, size, overlap)] == expected, piece


def test_short_and_long_documents_keep_their_owners_and_blank_ones_have_none(monkeypatch):
    monkeypatch.setattr(chunking, "SEGMENT", 50)
    long = " ".join(f"w{i}" for i in range(200))
    docs = [Document(t, {"n": n}) for n, t in enumerate(["short one", "  ", long, "tail", " " * 120])]
    got = chunked(Served("wordpiece"), docs, 16, 4)
    owners = [attributes["n"] for _, attributes in got]
    assert owners[0] == 0 and owners[-1] == 3 and set(owners) == {0, 2, 3} and owners == sorted(owners)
    assert [t for t, a in got if a["n"] == 2] == library_windows("wordpiece", long, 16, 4)


class Words:
    """A served model whose tokens are the words (as the fakes'): cheap, so that what is traced is chunking's."""

    async def token_offsets(self, texts, *, input_type=None):
        return [[(m.start(), m.end()) for m in re.finditer(r"\S+", t)] for t in texts]


def test_a_long_document_given_in_pieces_is_chunked_in_memory_that_does_not_grow_with_it(monkeypatch):
    """Documents of 0.5 and 4 MB arriving in 64 KB pieces (made as they are asked for), tokenized 20,000
    characters at a time: what chunking allocates at most at once (traced) is about the same for both, well under
    the larger's size, and the windows are the whole texts'."""
    monkeypatch.setattr(chunking, "SEGMENT", 20_000)
    served = Words()

    def peak_of(words: int) -> int:
        text = " ".join(f"w{i % 997}" for i in range(words))

        def given():
            parts = range(0, len(text), 65_536)
            for n, a in enumerate(parts):
                yield Piece(text[a : a + 65_536], n == 0, n == len(parts) - 1, {})

        windows = split_windows(
            [text], lambda t: asyncio.run(served.token_offsets(t)), window=64, chunking=Chunking(overlap=16)
        ).texts
        expected = iter(windows)

        async def run():
            tracemalloc.start()
            async for got, _ in chunk_documents(served, given(), 64, 16):
                assert got == next(expected)  # compared as they come: no list of them is traced
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            return peak

        peak = asyncio.run(run())
        assert next(expected, None) is None
        return peak

    small, large = peak_of(100_000), peak_of(800_000)  # 0.5 and 4 MB of text
    assert large < 1.3 * small and large < 2_000_000, (small, large)


def test_chunking_stops_as_soon_as_the_chunks_pass_their_limit(monkeypatch):
    monkeypatch.setattr(chunking, "SEGMENT", 50)
    served = Served("wordpiece")
    long = " ".join(f"w{i}" for i in range(5000))
    with pytest.raises(TooManyChunksError, match="more than 10 chunks") as caught:
        chunked(served, [Document(long)], 8, 0, max_chunks=10)
    assert caught.value.count == 11
    assert chunked(served, [Document("a b c")], 8, 0, max_chunks=1)


def test_segments_end_where_whitespace_begins_else_at_their_size():
    text = "alpha beta  gamma\tdelta " * 50
    parts = list(segments(text, size=100))  # its last tenth, 10 characters, always holds a run's start
    assert "".join(text[a:b] for a, b in parts) == text and all(b - a <= 100 for a, b in parts)
    assert all(text[b].isspace() and not text[b - 1].isspace() for _, b in parts[:-1])
    assert list(segments("x" * 95, size=40)) == [(0, 40), (40, 80), (80, 95)]
