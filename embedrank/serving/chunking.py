"""A file's documents cut into a store's chunks by a served model's tokens.

Chunks are the library's long-document windows (:func:`~embedrank.models.chunking.split_windows`): ``size``
tokens of the model's tokenizer overlapping by ``overlap``, each window the document's own text between its
first and last token, a document that fits one window kept whole. They are searched by
:class:`~embedrank.retrieval.store.StoreIndex`.

Memory stays bounded whatever a document's length: a document longer than :data:`SEGMENT` characters is
tokenized a segment at a time, each segment ending where a run of whitespace begins (the tokenizers split words
there, so the tokens are those of the whole text), and only the tokens of the windows not yet cut are kept. A
segment with no whitespace in its last tenth (a "line" of one word) ends at :data:`SEGMENT` characters, where
its tokens may differ from the whole text's. Chunking stops as soon as a document's chunks pass ``max_chunks``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

from embedrank.models.chunking import Offsets, split_windows, window_overlap
from embedrank.retrieval.documents import Document, InvalidFileError
from embedrank.serving.hosting import HostedModel
from embedrank.types import Chunking

SLICE = 256
"""Documents tokenized at a time while chunking."""
SEGMENT = 100_000
"""Characters tokenized at a time: the documents of one call together, or one segment of a longer document."""
_WHITESPACE_RUN = re.compile(r"(?<!\s)\s")


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
        stop = start + size
        cuts = [m.start() for m in _WHITESPACE_RUN.finditer(text, start + 1, stop + 1)]
        stop = cuts[-1] if cuts else stop
        yield start, stop
        start = stop
    yield start, len(text)


async def chunk_documents(
    served: HostedModel, docs: Sequence[Document], size: int, overlap: int, *, max_chunks: int | None = None
) -> list[tuple[str, int]]:
    """Every chunk of ``docs``: windows of ``size`` tokens of ``served``'s tokenizer overlapping by ``overlap``
    (a document that fits one is one chunk, its text as it is; a blank one has none); each chunk's text and the
    position of its document.

    Raises:
        TooManyChunksError: the chunks pass ``max_chunks`` (raised as soon as they do).
    """
    chunks: list[tuple[str, int]] = []

    def count(more: int) -> None:
        if max_chunks is not None and len(chunks) + more > max_chunks:
            raise TooManyChunksError(len(chunks) + more, max_chunks)

    short: list[int] = []
    chars = 0  # the characters of the short documents waiting
    for i, doc in enumerate(docs):
        if not doc.text.strip():
            continue
        if len(doc.text) > SEGMENT:
            await _flush(served, docs, short, size, overlap, chunks, count)
            async for text in _long_windows(served, doc.text, size, overlap):
                count(1)
                chunks.append((text, i))
            continue
        short.append(i)
        chars += len(doc.text)
        if len(short) == SLICE or chars > SEGMENT:
            await _flush(served, docs, short, size, overlap, chunks, count)
            chars = 0
    await _flush(served, docs, short, size, overlap, chunks, count)
    return chunks


async def _flush(
    served: HostedModel,
    docs: Sequence[Document],
    owners: list[int],
    size: int,
    overlap: int,
    chunks: list[tuple[str, int]],
    count: Callable[[int], None],
) -> None:
    """The windows of the short documents ``owners`` (emptied), tokenized in one call, appended to ``chunks``."""
    if not owners:
        return
    texts = [docs[i].text for i in owners]
    computed = iter(await served.token_offsets(texts, input_type="document"))

    def offsets(part: Sequence[str], computed: Iterator[Offsets] = computed) -> list[Offsets]:
        return [next(computed) for _ in part]  # split_windows asks for the texts in order

    windows = split_windows(texts, offsets, window=size, chunking=Chunking(overlap=overlap))
    count(len(windows.texts))
    chunks.extend((text, owners[int(owner)]) for text, owner in zip(windows.texts, windows.owners, strict=True))
    owners.clear()


async def _long_windows(served: HostedModel, text: str, size: int, overlap: int) -> AsyncIterator[str]:
    """The windows of one long document, as :func:`~embedrank.models.chunking.split_windows` cuts them (the same
    starts: every ``size - overlap`` tokens, the last window ending at the last token), tokenized a segment at a
    time; only the tokens from the next window's start on are kept."""
    step = max(1, size - window_overlap(Chunking(overlap=overlap), size))  # as split_windows takes it
    kept: list[tuple[int, int]] = []  # the spans of the tokens from ``first`` on
    first = start = 0  # ``start``: the next window's first token
    for a, b in segments(text, SEGMENT):
        spans = (await served.token_offsets([text[a:b]], input_type="document"))[0]
        kept.extend((s + a, e + a) for s, e in spans if e > s)
        while start + size < first + len(kept):  # a whole window, and tokens after it: the next one starts
            yield text[kept[start - first][0] : kept[start - first + size - 1][1]]
            start += step
        del kept[: start - first]
        first = start
    total = first + len(kept)
    if start == 0 and total <= size:
        yield text  # fits one window: unchanged
        return
    while True:
        end = min(start + size, total)
        yield text[kept[start - first][0] : kept[end - first - 1][1]]
        if start + size >= total:
            return
        start += step
