"""A file's documents cut into a store's chunks by a served model's tokens.

Chunks are the library's long-document windows (:func:`~embedrank.models.chunking.split_windows`): ``size``
tokens of the model's tokenizer overlapping by ``overlap``, each window the document's own text between its
first and last token, a document that fits one window kept whole. They are searched by
:class:`~embedrank.retrieval.store.StoreIndex`.

The documents come as the pieces a file reader gives (:func:`~embedrank.retrieval.documents.stream_documents`), and
the chunks leave one at a time, so memory stays bounded whatever a document's length: a document longer than
:data:`SEGMENT` characters is tokenized a segment at a time as its pieces arrive, each segment ending where a run of
whitespace begins (the tokenizers split words there, so the tokens are those of the whole text), and only the text
and tokens of the windows not yet cut are kept (from the document's start until its first window is cut, since a
document that fits one window is kept whole). A segment with no whitespace in its last tenth (a "line" of one word)
ends at :data:`SEGMENT` characters, where its tokens may differ from the whole text's. Chunking stops as soon as
the chunks pass ``max_chunks``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from embedrank.models.chunking import Offsets, split_windows, window_overlap
from embedrank.retrieval.documents import Document, InvalidFileError, Piece
from embedrank.serving.hosting import HostedModel
from embedrank.types import Chunking

SLICE = 256
"""Documents tokenized at a time while chunking."""
SEGMENT = 100_000
"""Characters tokenized at a time: the documents of one call together, or one segment of a longer document."""
_WHITESPACE_RUN = re.compile(r"(?<!\s)\s")
Chunk = tuple[str, Mapping[str, Any]]
"""A chunk's text and the attributes of its document."""


class TooManyChunksError(InvalidFileError):
    """The documents' chunks passed the number allowed (``count`` when chunking stopped)."""

    def __init__(self, count: int, limit: int) -> None:
        super().__init__(f"the file has more than {limit} chunks")
        self.count, self.limit = count, limit


async def window_of(served: HostedModel) -> int:
    """The tokens of a chunk ``served`` reads whole: its length less what its document prompt and special tokens
    take."""
    counts, _ = await served.count([""], input_type="document")
    return int(served.spec.max_seq_length - counts[0])


def _segment_end(text: str, start: int, size: int) -> int:
    """Where the part of ``text`` from ``start`` ends, ``text`` holding more than ``size`` characters from there:
    where the last run of whitespace it reaches begins (the run may begin just past it), else at ``size``."""
    stop = start + size
    cuts = [m.start() for m in _WHITESPACE_RUN.finditer(text, start + 1, stop + 1)]
    return cuts[-1] if cuts else stop


def segments(text: str, size: int = SEGMENT) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of consecutive parts of ``text`` of at most ``size`` characters, each but the last ending
    where the last run of whitespace it reaches begins (the run may begin just past it), so that no word is cut;
    a part with no whitespace at all ends at ``size`` characters.

    >>> list(segments("aaaa bbbb cccc dddd", size=10)), list(segments("abcdefgh", size=5))
    ([(0, 9), (9, 19)], [(0, 5), (5, 8)])
    >>> list(segments("ab cdefgh ij", size=8)), list(segments("abcdefgh ij", size=8))
    ([(0, 2), (2, 9), (9, 12)], [(0, 8), (8, 11)])
    """
    start = 0
    while len(text) - start > size:
        stop = _segment_end(text, start, size)
        yield start, stop
        start = stop
    yield start, len(text)


def pieces_of(docs: Iterable[Document]) -> Iterator[Piece]:
    """Whole documents as the pieces :func:`chunk_documents` takes (one each)."""
    for doc in docs:
        yield Piece(doc.text, True, True, doc.attributes)


async def chunk_documents(
    served: HostedModel,
    pieces: AsyncIterable[Piece] | Iterable[Piece],
    size: int,
    overlap: int,
    *,
    max_chunks: int | None = None,
) -> AsyncIterator[Chunk]:
    """Every chunk of the documents whose ``pieces`` are given (in order, as
    :func:`~embedrank.retrieval.documents.stream_documents` gives them): windows of ``size`` tokens of ``served``'s
    tokenizer overlapping by ``overlap`` (a document that fits one is one chunk, its text as it is; a blank one has
    none), each with its document's attributes, in order.

    Raises:
        TooManyChunksError: the chunks pass ``max_chunks`` (raised as soon as they do).
    """
    stream = aiter(pieces) if isinstance(pieces, AsyncIterable) else _async(pieces)
    given = 0

    def counted(chunks: Sequence[Chunk]) -> Sequence[Chunk]:
        nonlocal given
        if max_chunks is not None and given + len(chunks) > max_chunks:
            raise TooManyChunksError(given + len(chunks), max_chunks)
        given += len(chunks)
        return chunks

    short: list[Chunk] = []  # the short documents waiting: their texts and attributes
    chars = 0  # their characters
    async for piece in stream:
        parts, attributes, length, last = [piece.text], piece.attributes, len(piece.text), piece.last
        while not last and length <= SEGMENT:  # a document's start: whole, or longer than a segment
            piece = await anext(stream)
            parts.append(piece.text)
            length, last = length + len(piece.text), piece.last
        if length > SEGMENT:
            for chunk in counted(await _flush(served, short, size, overlap)):
                yield chunk
            chars = 0
            rest = _rest_of(stream) if not last else _async(())
            async for text in _long_windows(served, "".join(parts), rest, size, overlap):
                (chunk,) = counted([(text, attributes)])
                yield chunk
            continue
        text = "".join(parts)
        if not text.strip():
            continue
        short.append((text, attributes))
        chars += len(text)
        if len(short) == SLICE or chars > SEGMENT:
            for chunk in counted(await _flush(served, short, size, overlap)):
                yield chunk
            chars = 0
    for chunk in counted(await _flush(served, short, size, overlap)):
        yield chunk


async def _async(items: Iterable[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


async def _rest_of(stream: AsyncIterator[Piece]) -> AsyncIterator[str]:
    """The texts of the pieces of the document under way, up to its last."""
    async for piece in stream:
        yield piece.text
        if piece.last:
            return


async def _flush(served: HostedModel, short: list[Chunk], size: int, overlap: int) -> list[Chunk]:
    """The windows of the short documents waiting (``short``, emptied), tokenized in one call."""
    if not short:
        return []
    texts = [text for text, _ in short]
    computed = iter(await served.token_offsets(texts, input_type="document"))

    def offsets(part: Sequence[str], computed: Iterator[Offsets] = computed) -> list[Offsets]:
        return [next(computed) for _ in part]  # split_windows asks for the texts in order

    windows = split_windows(texts, offsets, window=size, chunking=Chunking(overlap=overlap))
    chunks = [(text, short[int(owner)][1]) for text, owner in zip(windows.texts, windows.owners, strict=True)]
    short.clear()
    return chunks


async def _long_windows(
    served: HostedModel, head: str, rest: AsyncIterator[str], size: int, overlap: int
) -> AsyncIterator[str]:
    """The windows of one long document whose text is ``head`` then the texts of ``rest``, as
    :func:`~embedrank.models.chunking.split_windows` cuts the whole text (the same starts: every ``size - overlap``
    tokens, the last window ending at the last token), tokenized a segment at a time as the text arrives; only the
    text and the tokens from the next window's start on are kept (all of it until the first window is cut)."""
    step = max(1, size - window_overlap(Chunking(overlap=overlap), size))  # as split_windows takes it
    buffer, base = head, 0  # the text kept, and where it begins in the document
    blank = not head.strip()
    done = False
    at = 0  # where the next segment begins in the document
    kept = np.empty((0, 2), dtype=np.int64)  # the spans of the tokens from ``first`` on, in the document
    first = start = 0  # ``start``: the next window's first token
    while True:
        while not done and base + len(buffer) - at <= SEGMENT:  # a segment is cut only with a character past it
            more = await anext(rest, None)
            if more is None:
                done = True
            else:
                buffer += more
                blank = blank and not more.strip()
        end = base + len(buffer)
        if end == at:
            break
        stop = _segment_end(buffer, at - base, SEGMENT) + base if end - at > SEGMENT else end
        offsets = (await served.token_offsets([buffer[at - base : stop - base]], input_type="document"))[0]
        spans = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
        kept = np.concatenate([kept, spans[spans[:, 1] > spans[:, 0]] + at])
        at = stop
        while start + size < first + len(kept):  # a whole window, and tokens after it: the next one starts
            yield buffer[kept[start - first, 0] - base : kept[start - first + size - 1, 1] - base]
            start += step
        kept = kept[start - first :]
        first = start
        if start > 0:  # the text before the next window's first token (or the next segment) is needed no more
            cut = int(min(kept[0, 0] if len(kept) else at, at)) - base
            if cut > len(buffer) // 2:
                buffer, base = buffer[cut:], base + cut
    total = first + len(kept)
    if blank:  # whitespace only: no chunk
        return
    if start == 0 and total <= size:
        yield buffer  # fits one window: unchanged (nothing was dropped: no window was cut)
        return
    while True:
        stop_token = min(start + size, total)
        yield buffer[kept[start - first, 0] - base : kept[stop_token - first - 1, 1] - base]
        if start + size >= total:
            return
        start += step
