"""A file's documents cut into a store's chunks by a served model's tokens.

Chunks are the library's long-document windows (:func:`~embedrank.models.chunking.split_windows`): ``size``
tokens of the model's tokenizer overlapping by ``overlap``, each window the document's own text between its
first and last token, a document that fits one window kept whole. They are searched by
:class:`~embedrank.retrieval.store.StoreIndex`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from embedrank.models.chunking import Offsets, split_windows
from embedrank.retrieval.documents import Document
from embedrank.serving.hosting import HostedModel
from embedrank.types import Chunking

SLICE = 256
"""Documents tokenized at a time while chunking."""


async def window_of(served: HostedModel) -> int:
    """The tokens of a chunk ``served`` reads whole: its length less what its document prompt and special tokens
    take."""
    counts, _ = await served.count([""], input_type="document")
    return int(served.spec.max_seq_length - counts[0])


async def chunk_documents(
    served: HostedModel, docs: Sequence[Document], size: int, overlap: int
) -> list[tuple[str, int]]:
    """Every chunk of ``docs``: windows of ``size`` tokens of ``served``'s tokenizer overlapping by ``overlap``
    (a document that fits one is one chunk, its text as it is; a blank one has none); each chunk's text and the
    position of its document."""
    chunks: list[tuple[str, int]] = []
    for first in range(0, len(docs), SLICE):
        owners = [i for i, d in enumerate(docs[first : first + SLICE], start=first) if d.text.strip()]
        if not owners:
            continue
        texts = [docs[i].text for i in owners]
        spans = await served.token_spans(texts, add_special_tokens=False)
        computed = iter([[(s.start, s.stop) for s in row if s.start is not None] for row in spans])

        def offsets(part: Sequence[str], computed: Iterator[Offsets] = computed) -> list[Offsets]:
            return [next(computed) for _ in part]  # split_windows asks for the texts in order

        windows = split_windows(texts, offsets, window=size, chunking=Chunking(overlap=overlap))
        chunks.extend((text, owners[int(owner)]) for text, owner in zip(windows.texts, windows.owners, strict=True))
    return chunks
