"""Long documents split into token windows, so that a reranker sees all of a document, not its first
``max_seq_length`` tokens.

A document that fits one window is left as it is (its score is what it was without chunking). A longer
one is cut into windows of ``window`` tokens that overlap by ``overlap`` tokens; each window is the
document's own text between the first and last character of its tokens (from the tokenizer's offsets),
so the model tokenizes it back to the same tokens. Each window is scored like a document, and
:func:`~embedrank.math.chunks.aggregate_window_scores` turns window scores into document scores.

For embeddings (opt-in), every window is embedded and :func:`pool_windows` returns each text's mean of
its window vectors, weighted by the windows' token counts and renormalized (vLLM's chunked processing).

``max_tokens`` (Cohere v2's ``max_tokens_per_doc``) and ``max_chunks`` (Cohere v1's ``max_chunks_per_doc``)
bound the work per document; text past either bound is not scored, and :attr:`Windows.cut` says which
documents lost text that way. The overlap is at most half the window, so a token is in at most two
windows and chunking at most doubles the work: by default it is 32 tokens or half the window if that is
less; an overlap asked for that is more than half the window is refused. ``budget`` bounds the tokens of
all windows together: the split stops and refuses as soon as they pass it, before the rest is tokenized.
"""

from __future__ import annotations

import dataclasses
import re  # noqa: F401 - used by the doctests
from collections.abc import Callable, Sequence

import numpy as np

from embedrank.errors import InputTooLongError, InvalidInputError, RequestTooLargeError
from embedrank.math.chunks import aggregate_window_scores, mean_window_vectors
from embedrank.math.similarity import l2_normalize
from embedrank.types import Aggregation, Chunking, ModelOutput

Offsets = list[tuple[int, int]]  # (start, end) character span of each token, special tokens excluded
DEFAULT_OVERLAP = 32
SLICE = 32  # texts tokenized at a time while splitting, so that a budget stops the work early


@dataclasses.dataclass(frozen=True)
class Windows:
    """The windows of a list of documents, in document order.

    ``texts``: ``W`` window texts; ``owners``: ``(W,)`` the document of each; ``chunked``: documents split
    into more than one window; ``cut``: per document, whether text past ``max_tokens`` or ``max_chunks``
    was left out.
    """

    texts: list[str]
    owners: np.ndarray
    chunked: int
    cut: list[bool]


def window_starts(n_tokens: int, window: int, overlap: int) -> list[int]:
    """First token of each window over ``n_tokens`` tokens: windows of ``window`` tokens, each starting
    ``window - overlap`` after the previous (at least 1), the last one ending at the last token.

    >>> window_starts(10, 4, 1), window_starts(4, 4, 1), window_starts(5, 4, 0)
    ([0, 3, 6], [0], [0, 4])
    """
    step = max(1, window - overlap)
    starts = [0]
    while starts[-1] + window < n_tokens:
        starts.append(starts[-1] + step)
    return starts


def window_overlap(chunking: Chunking, window: int) -> int:
    """The overlap of windows of ``window`` tokens: as asked, at most half the window; by default 32 or half.

    >>> window_overlap(Chunking(), 512), window_overlap(Chunking(), 40), window_overlap(Chunking(overlap=0), 9)
    (32, 20, 0)

    Raises:
        InvalidInputError: an overlap asked for that is more than half the window (``param="overlap"``).
    """
    if chunking.overlap is None:
        return min(DEFAULT_OVERLAP, window // 2)
    if chunking.overlap > window // 2:
        raise InvalidInputError(
            f"overlap={chunking.overlap} is more than half the window of {window} tokens; at most {window // 2} "
            "(a larger overlap multiplies the work)",
            param="overlap",
        )
    return chunking.overlap


def split_windows(
    documents: Sequence[str],
    offsets: Callable[[Sequence[str]], list[Offsets]],
    *,
    window: int,
    chunking: Chunking,
    budget: int | None = None,
) -> Windows:
    """Split each document into windows of at most ``window`` tokens (see the module docstring).

    ``offsets(texts)`` gives each text's token character spans, special tokens excluded (a fast
    tokenizer's ``return_offsets_mapping``, or the fakes' words). With ``budget``, texts are tokenized a
    slice at a time and :class:`~embedrank.errors.RequestTooLargeError` is raised as soon as the windows
    hold more than ``budget`` tokens.

    >>> words = lambda texts: [[(m.start(), m.end()) for m in re.finditer(r"\\S+", t)] for t in texts]
    >>> w = split_windows(["a b c d e f", "short"], words, window=4, chunking=Chunking(overlap=2))
    >>> w.texts, w.owners.tolist(), w.chunked, w.cut
    (['a b c d', 'c d e f', 'short'], [0, 0, 1], 1, [False, False])
    >>> split_windows(["a b c d e f"], words, window=2, chunking=Chunking(overlap=0, max_chunks=2)).texts
    ['a b', 'c d']
    """
    if window < 1:
        raise InvalidInputError(f"the window must hold at least one token, got {window}", param="window")
    overlap = window_overlap(chunking, window)
    texts: list[str] = []
    owners: list[int] = []
    chunked = total = 0
    cut: list[bool] = []
    for first in range(0, len(documents), SLICE):
        part = documents[first : first + SLICE]
        for doc_index, (doc, spans) in enumerate(zip(part, offsets(part), strict=True), start=first):
            spans = [s for s in spans if s[1] > s[0]]  # drop empty spans some tokenizers give
            kept = len(spans) if chunking.max_tokens is None else min(len(spans), chunking.max_tokens)
            starts = window_starts(kept, window, overlap)
            if chunking.max_chunks is not None and len(starts) > chunking.max_chunks:
                starts = starts[: chunking.max_chunks]
            last_end = min(starts[-1] + window, kept)
            cut.append(last_end < len(spans))
            total += sum(min(start + window, kept) - start for start in starts) if kept else 1
            if len(starts) == 1 and not cut[-1]:
                texts.append(doc)  # fits one window: unchanged
            else:
                chunked += len(starts) > 1
                for start in starts:
                    end = min(start + window, kept)
                    texts.append(doc[spans[start][0] : spans[end - 1][1]] if end > start else doc)
            owners.extend([doc_index] * (len(texts) - len(owners)))
        if budget is not None and total > budget:
            raise RequestTooLargeError(
                f"the windows of the first {min(first + SLICE, len(documents))} of {len(documents)} texts already "
                f"hold {total} tokens; the limit is {budget} per request"
            )
    return Windows(texts=texts, owners=np.asarray(owners, dtype=np.int64), chunked=chunked, cut=cut)


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
    """Texts split into windows, and how the windows' results become the texts' results.

    The one plan both paths follow: the models run it synchronously (:meth:`Encoder.encode_with_stats
    <embedrank.models.encoder.Encoder.encode_with_stats>`, :func:`score_chunked`), the serving runners
    through the batching engine; only who computes the windows differs.
    """

    windows: Windows
    aggregate: Aggregation

    @classmethod
    def make(
        cls,
        texts: Sequence[str],
        offsets: Callable[[Sequence[str]], list[Offsets]],
        *,
        window: int,
        chunking: Chunking,
        truncate: bool = True,
        param: str = "documents",
        budget: int | None = None,
    ) -> ChunkPlan:
        """Split ``texts`` (``chunking.window`` wins over ``window``); with ``truncate=False``, refuse a text
        whose end the chunking bounds would leave out (``InputTooLongError`` naming ``param[i]``); ``budget``
        as :func:`split_windows`."""
        windows = split_windows(texts, offsets, window=chunking.window or window, chunking=chunking, budget=budget)
        if not truncate:
            refuse_cut(windows.cut, chunking, param)
        return cls(windows, chunking.aggregate)

    @property
    def texts(self) -> list[str]:
        """The ``W`` window texts, in text order: what to embed or score."""
        return self.windows.texts

    def vectors(self, out: ModelOutput, *, normalize: bool) -> ModelOutput:
        """The texts' vectors from the windows' (:func:`pool_windows`)."""
        return pool_windows(out, self.windows, normalize=normalize)

    def scores(
        self,
        window_scores: np.ndarray,
        token_counts: Sequence[int],
        windows_truncated: Sequence[bool],
        *,
        leading_flags: Sequence[bool] = (),
    ) -> ModelOutput:
        """The texts' scores ``(N,)`` from the windows' ``(W,)`` (aggregated), with ``token_counts`` as given
        and truncation flags per text after ``leading_flags`` (e.g. the query's)."""
        n = len(self.windows.cut)
        scores = aggregate_window_scores(
            np.asarray(window_scores, dtype=np.float32), self.windows.owners, n, self.aggregate
        )
        flags = [*leading_flags, *document_flags(self.windows, windows_truncated)]
        return ModelOutput(scores, list(token_counts), flags, self.windows.chunked)


def refuse_cut(cut: Sequence[bool], chunking: Chunking, param: str = "documents") -> None:
    """With truncation off, a text whose end the chunking bounds would leave out is refused."""
    bounds = f"max_tokens={chunking.max_tokens}, max_chunks={chunking.max_chunks}"
    for index, was_cut in enumerate(cut):
        if was_cut:
            raise InputTooLongError(
                f"{param}[{index}] is longer than the chunking bounds allow ({bounds}) and truncation was "
                f"disabled; raise those bounds or allow truncation",
                param=param,
                index=index,
            )


def score_chunked(
    documents: Sequence[str],
    score: Callable[[list[str]], np.ndarray],
    *,
    offsets: Callable[[Sequence[str]], list[Offsets]],
    window: int,
    chunking: Chunking,
) -> tuple[np.ndarray, Windows]:
    """Score every window of every document in one call of ``score(texts) -> (W,)``, then aggregate:
    ``(N,)`` float32 document scores, and the windows."""
    plan = ChunkPlan.make(documents, offsets, window=window, chunking=chunking)
    window_scores = score(plan.texts)
    n = len(plan.texts)
    return plan.scores(window_scores, [0] * n, [False] * n).values, plan.windows


def pool_windows(out: ModelOutput, windows: Windows, *, normalize: bool) -> ModelOutput:
    """Per text: the token-weighted mean of its window vectors (``out.values`` ``(W, D)``), renormalized
    when ``normalize``; token counts summed over the windows; ``truncated`` when text was left out (the
    chunking bounds, or a window cut at the max length)."""
    n = len(windows.cut)
    weights = np.asarray(out.token_counts, dtype=np.float64)
    vectors = mean_window_vectors(out.values, windows.owners, n, weights)  # (N, D)
    flags = document_flags(windows, out.truncated)
    return ModelOutput(
        l2_normalize(vectors) if normalize else vectors, summed_counts(windows, weights), flags, windows.chunked
    )


def summed_counts(windows: Windows, token_counts: Sequence[float] | np.ndarray) -> list[int]:
    """Per text: the token counts of its windows (``(W,)``), summed."""
    weights = np.asarray(token_counts, dtype=np.float64)
    return np.bincount(windows.owners, weights=weights, minlength=len(windows.cut)).astype(np.int64).tolist()


def require_max(chunking: Chunking, why: str) -> None:
    """Refuse ``chunking`` unless its windows combine by max (``why``: the reason, said in the error)."""
    if chunking.aggregate != "max":
        raise InvalidInputError(f"{why}: aggregate must be 'max', got {chunking.aggregate!r}", param="aggregate")


def require_fits(window: int | None, fits: int) -> None:
    """Refuse a ``window`` longer than the ``fits`` tokens of a text the model reads (its windows would be
    cut again); None: the model's length."""
    if window is not None and window > fits:
        raise InvalidInputError(
            f"window {window} is longer than the {fits} tokens of a document the model reads", param="window"
        )


def document_flags(windows: Windows, windows_truncated: Sequence[bool]) -> list[bool]:
    """Per document: whether text was left out, by the chunking bounds or by a window cut at the max length."""
    flags = list(windows.cut)
    for owner, was_truncated in zip(windows.owners.tolist(), windows_truncated, strict=True):
        flags[owner] = flags[owner] or was_truncated
    return flags
