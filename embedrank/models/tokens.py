"""Tokenization with per-input token counts and truncation flags: :class:`TextTokens`, the one tokenizer
component every model kind composes (encoders, sparse encoders, cross-encoders, and through their encoder
ColBERT and bge-m3 models), over the functions below.

The checks of what a model is called with live in :mod:`embedrank.models.checks`, the ordering of inputs
into batches of the closest lengths in :mod:`embedrank.models.batching`.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from embedrank.models import batching
from embedrank.models.batching import AHEAD_CHUNK, TOKENIZE_CHUNK, by_length
from embedrank.models.checks import check_max_seq_length, check_truncation


@dataclasses.dataclass(frozen=True)
class Tokenized:
    """A padded batch ready for the model, plus what happened to each input.

    ``features`` hold ``(B, T)`` tensors; ``token_counts[i]`` is the number of tokens the model
    processes for input ``i`` (after truncation, special tokens included); ``truncated[i]`` says
    whether input ``i`` was cut at the maximum length.
    """

    features: dict[str, torch.Tensor]
    token_counts: list[int]
    truncated: list[bool]


@dataclasses.dataclass(frozen=True, slots=True)
class TokenRow:
    """One input tokenized once, unpadded, as the model will see it: ``tokens`` in the model's own form (for a
    transformer, the feature lists of :func:`encode_rows`), ``length`` the tokens it costs (special tokens
    included), and whether it was cut at the maximum length. The serving engine budgets batches on
    ``length`` and hands the rows back to the model, so nothing is tokenized twice."""

    tokens: Any
    length: int
    truncated: bool
    skip: int = 0  # leading tokens pooling leaves out (a prompt, for models that pool without it)
    adapter: int = -1  # the LoRA adapter the row runs with, by the runtime's index (-1: none, the base model)


def token_rows(rows: Sequence[dict[str, list[int]]], truncated: Sequence[bool], skip: int = 0) -> list[TokenRow]:
    """:func:`encode_rows`' output as :class:`TokenRow` items.

    >>> token_rows([{"input_ids": [101, 7, 102]}], [False])[0].length
    3
    """
    return [TokenRow(r, len(r["input_ids"]), t, skip) for r, t in zip(rows, truncated, strict=True)]


def with_adapter(rows: list[TokenRow], index: int) -> list[TokenRow]:
    """``rows`` marked with the LoRA adapter of runtime index ``index`` (-1, the base model: as they are).

    >>> [row.adapter for row in with_adapter(token_rows([{"input_ids": [101, 102]}], [False]), 2)]
    [2]
    """
    return rows if index < 0 else [dataclasses.replace(row, adapter=index) for row in rows]


def collate_rows(tokenizer: Any, rows: Sequence[TokenRow]) -> Tokenized:
    """Pad :class:`TokenRow` items of a transformer into one batch (:func:`collate`)."""
    return collate(tokenizer, [r.tokens for r in rows], [r.truncated for r in rows])


def encode_rows(
    tokenizer: Any,
    texts: Sequence[str],
    pairs: Sequence[str] | None = None,
    *,
    max_length: int,
) -> tuple[list[dict[str, list[int]]], list[bool]]:
    """Tokenize without padding, truncating at ``max_length`` the way sentence-transformers does.

    Returns one dict of token lists per input and a flag per input telling whether it was cut.
    Single texts on a fast tokenizer get the flag from the same pass (overflow), on a kept copy of its Rust
    tokenizer where :func:`_backend` gives one; otherwise only the rows that come out exactly ``max_length``
    long are tokenized again to tell.
    """
    texts = list(texts)
    if pairs is None and (backend := _backend(tokenizer, max_length)) is not None:
        return _encode_backend(tokenizer, backend, texts)
    if pairs is None and getattr(tokenizer, "is_fast", False):
        enc = tokenizer(
            texts, truncation=True, max_length=max_length, return_overflowing_tokens=True, return_attention_mask=True
        )
        mapping = enc["overflow_to_sample_mapping"]
        keys = [k for k in enc if k != "overflow_to_sample_mapping"]
        rows: list[dict[str, list[int]]] = [{}] * len(texts)
        truncated = [False] * len(texts)
        seen = [False] * len(texts)
        for row, sample in enumerate(mapping):
            if seen[sample]:
                truncated[sample] = True
            else:
                seen[sample] = True
                rows[sample] = {k: enc[k][row] for k in keys}
        return rows, truncated
    args: tuple[Any, ...] = (texts,) if pairs is None else (texts, list(pairs))
    enc = tokenizer(*args, truncation="longest_first", max_length=max_length, return_attention_mask=True)
    keys = list(enc)
    rows = [{k: enc[k][i] for k in keys} for i in range(len(texts))]
    truncated = [False] * len(texts)
    full_rows = [i for i, r in enumerate(rows) if len(r["input_ids"]) >= max_length]
    if full_rows:
        sub = [[args[k][i] for i in full_rows] for k in range(len(args))]
        full = tokenizer(*sub, truncation=False, padding=False, verbose=False)["input_ids"]
        for row, ids in zip(full_rows, full, strict=True):
            truncated[row] = len(ids) > max_length
    return rows, truncated


_BACKENDS: weakref.WeakKeyDictionary[Any, dict[int, Any]] = weakref.WeakKeyDictionary()
_FEATURES = {"input_ids": "ids", "token_type_ids": "type_ids", "attention_mask": "attention_mask"}


def _backend(tokenizer: Any, max_length: int) -> Any:
    """A copy of ``tokenizer``'s Rust tokenizer set to truncate at ``max_length`` as its own call with
    ``truncation=True`` would (longest first, its truncation side and special-token splitting), or None where
    that call does more than the Rust tokenizer (not a fast tokenizer; features besides ids, type ids and mask).

    The copy is kept per tokenizer and length: calling the tokenizer itself re-applies its settings to its
    Rust tokenizer each time and wraps every row in Python objects: tokenizing through it was a quarter of
    the service's event-loop time on one-query requests, through the copy a fifth.
    """
    import transformers

    if not isinstance(tokenizer, transformers.PreTrainedTokenizerFast):
        return None
    if not set(tokenizer.model_input_names) <= set(_FEATURES) or "input_ids" not in tokenizer.model_input_names:
        return None
    try:
        kept = _BACKENDS.setdefault(tokenizer, {})
    except TypeError:  # not weak-referenceable
        return None
    if max_length not in kept:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        backend.no_padding()
        backend.enable_truncation(max_length, stride=0, strategy="longest_first", direction=tokenizer.truncation_side)
        backend.encode_special_tokens = bool(getattr(tokenizer, "split_special_tokens", False))
        kept[max_length] = backend
    return kept[max_length]


def _encode_backend(tokenizer: Any, backend: Any, texts: list[str]) -> tuple[list[dict[str, list[int]]], list[bool]]:
    """:func:`encode_rows` of single texts on the Rust tokenizer of :func:`_backend`: the same rows (the
    features ``tokenizer.model_input_names`` lists, attention mask always) and cut flags (overflow)."""
    names = [n for n in _FEATURES if n in tokenizer.model_input_names or n == "attention_mask"]
    # one text: encode holds the GIL for its ~20 us; encode_batch releases and takes it back, which on a busy
    # server waits for the forward thread's Python work and switches threads
    encodings = (
        [backend.encode(texts[0], add_special_tokens=True)]
        if len(texts) == 1
        else backend.encode_batch(texts, add_special_tokens=True)
    )
    rows = [{n: getattr(e, _FEATURES[n]) for n in names} for e in encodings]
    return rows, [bool(e.overflowing) for e in encodings]


def collate(tokenizer: Any, rows: Sequence[dict[str, list[int]]], truncated: Sequence[bool]) -> Tokenized:
    """Pad rows from :func:`encode_rows` to the longest one; ``(B, T)`` int64 tensors, padded on the tokenizer's
    side with its pad id (ids), its pad type id (type ids) and 0 (mask), as ``tokenizer.pad`` does."""
    counts = [len(r["input_ids"]) for r in rows]
    names = list(rows[0]) if rows else []
    pads = {
        "input_ids": tokenizer.pad_token_id,
        "attention_mask": 0,
        "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0),
    }
    if not rows or set(names) - set(pads) or pads["input_ids"] is None:
        features = dict(tokenizer.pad(list(rows), padding=True, return_tensors="pt"))
        return Tokenized(features=features, token_counts=counts, truncated=list(truncated))
    left = getattr(tokenizer, "padding_side", "right") == "left"
    features = pad_features(rows, names, pads, left=left)
    return Tokenized(features=features, token_counts=counts, truncated=list(truncated))


def pad_features(
    rows: Sequence[Mapping[str, Sequence[int]]], names: Sequence[str], pads: Mapping[str, int], *, left: bool = False
) -> dict[str, torch.Tensor]:
    """Each feature of ``names`` of ``rows`` padded to the longest row with ``pads[name]``, on the right (or the
    ``left``); ``(B, T)`` int64 tensors.

    >>> pad_features([{"input_ids": [5, 6]}, {"input_ids": [7]}], ["input_ids"], {"input_ids": 0})["input_ids"].tolist()
    [[5, 6], [7, 0]]
    """
    counts = [len(r["input_ids"]) for r in rows]
    width = max(counts)
    features = {}
    for name in names:
        out = np.full((len(rows), width), pads[name], dtype=np.int64)
        for i, (row, n) in enumerate(zip(rows, counts, strict=True)):
            if left:
                out[i, width - n :] = row[name]
            else:
                out[i, :n] = row[name]
        features[name] = torch.from_numpy(out)
    return features


@dataclasses.dataclass(frozen=True)
class TokenSpan:
    """One token as the model sees it: its id, its text, whether it is a special token, and its character
    span in the input (None for special tokens, which have none)."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


def text_offsets(tokenizer: Any, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
    """Character span of each token of each text, special tokens excluded, untruncated (what
    :func:`~embedrank.models.chunking.split_windows` splits long texts on)."""
    enc = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True, truncation=False, verbose=False)
    return [[(int(a), int(b)) for a, b in spans] for spans in enc["offset_mapping"]]


def token_spans(tokenizer: Any, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[TokenSpan]]:
    """Every token of each text, untruncated: a text token's ``text`` is the input's characters it covers,
    a special token's is its spelling (as TEI's ``/tokenize``)."""
    enc = tokenizer(
        list(texts),
        add_special_tokens=add_special_tokens,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
        truncation=False,
        verbose=False,
    )
    out = []
    for text, ids, spans, special in zip(
        texts, enc["input_ids"], enc["offset_mapping"], enc["special_tokens_mask"], strict=True
    ):
        row = []
        for token, (a, b), is_special in zip(ids, spans, special, strict=True):
            if is_special:
                row.append(TokenSpan(int(token), tokenizer.convert_ids_to_tokens(int(token)), True, None, None))
            else:
                row.append(TokenSpan(int(token), text[a:b], False, int(a), int(b)))
        out.append(row)
    return out


def token_lengths(tokenizer: Any, texts: Sequence[str], pairs: Sequence[str] | None = None) -> list[int]:
    """Untruncated token count of each input (or pair), special tokens included; for checks before any compute.

    >>> fake = lambda *a, **k: {"input_ids": [[0] * (len(t.split()) + 2) for t in a[0]]}
    >>> token_lengths(fake, ["one two", "three"])
    [4, 3]
    """
    args: tuple[Any, ...] = (list(texts),) if pairs is None else (list(texts), list(pairs))
    enc = tokenizer(*args, truncation=False, padding=False, verbose=False)
    return [len(ids) for ids in enc["input_ids"]]


def seen_tokens(tokenizer: Any, texts: Sequence[str], max_length: int | None) -> list[list[str]]:
    """The tokens of each text as the tokenizer spells them, special tokens included, cut at ``max_length``
    (None: untruncated)."""
    enc = tokenizer(list(texts), truncation=max_length is not None, max_length=max_length, verbose=False)
    return [tokenizer.convert_ids_to_tokens(ids) for ids in enc["input_ids"]]


def tokenize(
    tokenizer: Any,
    texts: Sequence[str],
    pairs: Sequence[str] | None = None,
    *,
    max_length: int,
    truncate: bool = True,
) -> Tokenized:
    """Tokenize ``texts`` (or ``(texts[i], pairs[i])`` pairs) into one padded batch.

    Padding is to the longest input, truncation is ``longest_first`` at ``max_length``, as in
    sentence-transformers.

    Raises:
        InputTooLongError: ``truncate=False`` and some input is longer than ``max_length``.
    """
    rows, truncated = encode_rows(tokenizer, texts, pairs, max_length=max_length)
    batch = collate(tokenizer, rows, truncated)
    check_truncation(batch.truncated, max_length, truncate)
    return batch


class TextTokens:
    """A model's tokenizer and window as every model kind uses them: texts (or ``(text, pair)`` pairs) to
    unpadded rows, padded batches and batches of the closest lengths, and the token accounting the service
    reports (counts, the tokens seen, spans, offsets). ``lower_case``: texts are lowercased first (a
    sentence-transformers model whose transformer was trained on lowercased text). ``max_length`` is the
    window, changed by setting the model's ``max_seq_length``.

    >>> from transformers import AutoTokenizer
    >>> from embedrank.registry import resolve
    >>> tokens = TextTokens(AutoTokenizer.from_pretrained(resolve("all-MiniLM-L6-v2").path), max_length=4)
    >>> [r.length for r in tokens.rows(["red apples", "an apple and a pear"])], tokens.lengths(["an apple and a pear"])
    ([4, 4], [7])
    """

    def __init__(self, tokenizer: Any, *, max_length: int, lower_case: bool = False) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.lower_case = lower_case

    def prepare(self, texts: Sequence[str]) -> list[str]:
        """``texts`` as the tokenizer is given them (lowercased for a ``lower_case`` model)."""
        return [t.lower() for t in texts] if self.lower_case else list(texts)

    def _args(self, texts: Sequence[str], pairs: Sequence[str] | None) -> tuple[list[str], list[str] | None]:
        return self.prepare(texts), None if pairs is None else self.prepare(pairs)

    def rows(
        self, texts: Sequence[str], pairs: Sequence[str] | None = None, *, skip: int = 0, max_length: int | None = None
    ) -> list[TokenRow]:
        """One unpadded :class:`TokenRow` per text (or pair), cut at the window (``max_length``: another one);
        ``skip``: the leading tokens pooling leaves out."""
        rows, cut = encode_rows(self.tokenizer, *self._args(texts, pairs), max_length=max_length or self.max_length)
        return token_rows(rows, cut, skip)

    def collate(self, rows: Sequence[TokenRow]) -> Tokenized:
        """Rows from :meth:`rows` padded into one batch."""
        return collate_rows(self.tokenizer, rows)

    def batch(self, texts: Sequence[str], pairs: Sequence[str] | None = None, *, truncate: bool = True) -> Tokenized:
        """``texts`` (or pairs) as one padded batch, truncated ``longest_first`` at the window as
        sentence-transformers does.

        Raises:
            InputTooLongError: ``truncate=False`` and an input is longer than the window.
        """
        return tokenize(self.tokenizer, *self._args(texts, pairs), max_length=self.max_length, truncate=truncate)

    def batches(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        batch_size: int,
        truncate: bool = True,
        param: str = "texts",
        ahead: bool = False,
    ) -> Iterator[tuple[list[int], Tokenized]]:
        """``texts`` (or pairs) tokenized a chunk at a time, once, in padded batches of the closest token lengths
        (:func:`~embedrank.models.batching.by_length`), with each batch's input positions.

        ``ahead``: chunks of :data:`~embedrank.models.batching.AHEAD_CHUNK` inputs, the next one tokenized and
        collated in a worker thread while the caller runs this one's batches (the tokenizer releases the GIL),
        so a GPU's forward passes do not wait for the tokenizer.

        Raises:
            InputTooLongError: ``truncate=False`` and an input is longer than the window; the error names it
                as ``param[i]`` with ``i`` its position in ``texts``.
        """
        texts, pairs = self._args(texts, pairs)

        def chunk(start: int, end: int) -> list[tuple[list[int], Tokenized]]:
            chunk_pairs = None if pairs is None else pairs[start:end]
            rows, cut = encode_rows(self.tokenizer, texts[start:end], chunk_pairs, max_length=self.max_length)
            check_truncation(cut, self.max_length, truncate, offset=start, param=param)
            return [
                ([start + i for i in idx], collate(self.tokenizer, [rows[i] for i in idx], [cut[i] for i in idx]))
                for idx in by_length([len(r["input_ids"]) for r in rows], batch_size)
            ]

        workers = batching.ahead_workers()
        # ahead: chunks small enough that every worker has one and the first batches start soon, but of a few
        # batches each (a chunk's batches are sorted by length within it)
        size = min(AHEAD_CHUNK, max(4 * batch_size, -(-len(texts) // (2 * workers)))) if ahead else TOKENIZE_CHUNK
        starts = range(0, len(texts), size)
        if not ahead or len(starts) < 2:
            for start in starts:
                yield from chunk(start, start + size)
            return
        # up to AHEAD_WORKERS chunks tokenized at once, handed over in order
        workers = min(workers, len(starts))
        with ThreadPoolExecutor(workers, thread_name_prefix="embedrank-tokenize") as pool:
            coming = deque(pool.submit(chunk, start, start + size) for start in starts[:workers])
            for start in starts[workers:]:
                batches = coming.popleft().result()
                coming.append(pool.submit(chunk, start, start + size))
                yield from batches
            while coming:
                yield from coming.popleft().result()

    def lengths(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> list[int]:
        """Untruncated token count of each text (or pair), special tokens included."""
        return token_lengths(self.tokenizer, *self._args(texts, pairs))

    def seen(self, texts: Sequence[str], *, truncate: bool = True) -> list[list[str]]:
        """The tokens of each text as the tokenizer spells them, cut at the window unless ``truncate=False``."""
        return seen_tokens(self.tokenizer, self.prepare(texts), self.max_length if truncate else None)

    def spans(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[TokenSpan]]:
        """Every token of each text with its id and character span, untruncated (:func:`token_spans`)."""
        return token_spans(self.tokenizer, self.prepare(texts), add_special_tokens=add_special_tokens)

    def offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Character span of each token of each text, special tokens excluded, untruncated."""
        return text_offsets(self.tokenizer, self.prepare(texts))

    def special(self, *, pair: bool = False) -> int:
        """Tokens a text (or a pair) costs besides its own."""
        return int(self.tokenizer.num_special_tokens_to_add(pair=pair))


class TokenizesText:
    """The tokenizer and the window of a model that tokenizes with its :class:`TextTokens` (``text_tokens``)."""

    text_tokens: TextTokens

    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer."""
        return self.text_tokens.tokenizer

    @property
    def max_seq_length(self) -> int:
        """The window in tokens (special tokens included); set it to read less (or more) of each text."""
        return self.text_tokens.max_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        check_max_seq_length(value)
        self.text_tokens.max_length = value
