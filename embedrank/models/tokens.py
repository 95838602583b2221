"""Tokenization with per-input token counts and truncation flags, shared by encoders and cross-encoders."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from embedrank.errors import InputTooLongError, InvalidInputError

PROGRESS_THRESHOLD = 1024  # inputs; above this, encode and score show a progress bar unless told otherwise


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


def token_rows(rows: Sequence[dict[str, list[int]]], truncated: Sequence[bool], skip: int = 0) -> list[TokenRow]:
    """:func:`encode_rows`' output as :class:`TokenRow` items.

    >>> token_rows([{"input_ids": [101, 7, 102]}], [False])[0].length
    3
    """
    return [TokenRow(r, len(r["input_ids"]), t, skip) for r, t in zip(rows, truncated, strict=True)]


def collate_rows(tokenizer: Any, rows: Sequence[TokenRow]) -> Tokenized:
    """Pad :class:`TokenRow` items of a transformer into one batch (:func:`collate`)."""
    return collate(tokenizer, [r.tokens for r in rows], [r.truncated for r in rows])


def run_by_length(
    rows: Sequence[TokenRow], batch_size: int, run: Callable[[list[TokenRow]], Sequence[Any]]
) -> list[Any]:
    """``run`` over batches of ``rows`` of the closest lengths, longest first (little padding); its values
    (one per row) back in input order.

    >>> run_by_length(token_rows([{"input_ids": [1]}, {"input_ids": [1, 2, 3]}], [False, False]), 1, lambda b: [b[0].length])
    [1, 3]
    """
    out: list[Any] = [None] * len(rows)
    order = np.argsort([-r.length for r in rows], kind="stable")
    for start in range(0, len(rows), batch_size):
        positions = order[start : start + batch_size]
        for i, value in zip(positions, run([rows[i] for i in positions]), strict=True):
            out[i] = value
    return out


def check_texts(texts: Any, name: str = "texts") -> list[str]:
    """Validate a list of input strings and return it as a list.

    >>> check_texts(["a", ""])
    ['a', '']
    >>> check_texts([])
    Traceback (most recent call last):
    ...
    embedrank.errors.InvalidInputError: texts is empty; pass at least one string
    """
    if isinstance(texts, str):
        raise InvalidInputError(f"{name} must be a list of strings, not a single string; wrap it in a list")
    try:
        items = list(texts)
    except TypeError:
        raise InvalidInputError(f"{name} must be a list of strings, got {type(texts).__name__}") from None
    if not items:
        raise InvalidInputError(f"{name} is empty; pass at least one string")
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise InvalidInputError(f"{name}[{i}] must be a string, got {type(item).__name__}")
    return items


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


def too_long_error(
    index: int, max_length: int, *, param: str = "input", tokens: int | None = None
) -> InputTooLongError:
    """The error for ``param[index]`` (``query``: the one query) being longer than ``max_length`` tokens when
    truncation was not allowed."""
    size = f" ({tokens} tokens)" if tokens is not None else ""
    where = param if param == "query" else f"{param}[{index}]"
    return InputTooLongError(
        f"{where} is longer{size} than the model's maximum of {max_length} tokens and truncation was disabled",
        param=param,
        index=index,
    )


def check_truncation(
    truncated: Sequence[bool], max_length: int, truncate: bool, *, offset: int = 0, param: str = "input"
) -> None:
    """Raise :func:`too_long_error` for the first cut input (``param[offset + i]``) when truncation is off."""
    if not truncate and any(truncated):
        raise too_long_error(offset + list(truncated).index(True), max_length, param=param)


@dataclasses.dataclass(frozen=True)
class TokenSpan:
    """One token as the model sees it: its id, its text, whether it is a special token, and its character
    span in the input (None for special tokens, which have none)."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


def check_max_seq_length(value: int | None) -> None:
    """Refuse a model window that is not a positive number of tokens (None: the model's own).

    >>> check_max_seq_length(0)
    Traceback (most recent call last):
    embedrank.errors.InvalidInputError: max_seq_length must be a positive integer (None: the model's own), got 0
    """
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidInputError(
            f"max_seq_length must be a positive integer (None: the model's own), got {value!r}", param="max_seq_length"
        )


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


def first_too_long(lengths: Sequence[int], max_length: int) -> int | None:
    """Index of the first length over ``max_length``, or None.

    >>> first_too_long([3, 300, 400], 256)
    1
    """
    return next((i for i, n in enumerate(lengths) if n > max_length), None)


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


TOKENIZE_CHUNK = 8192  # inputs tokenized at once before length-sorted batching


def length_batches(
    tokenizer: Any,
    texts: Sequence[str],
    pairs: Sequence[str] | None = None,
    *,
    max_length: int,
    batch_size: int,
    truncate: bool = True,
    param: str = "texts",
) -> Iterator[tuple[list[int], Tokenized]]:
    """Tokenize ``texts`` (or ``(texts[i], pairs[i])`` pairs) a chunk at a time, once, and yield padded
    batches of inputs with the closest token lengths, longest first, with their input positions.

    Sorting by exact token length pads less than sorting by characters, as sentence-transformers does.

    Raises:
        InputTooLongError: ``truncate=False`` and some input is longer than ``max_length``; the error
            names it as ``param[i]`` with ``i`` its position in ``texts``.
    """
    for chunk_start in range(0, len(texts), TOKENIZE_CHUNK):
        chunk_end = chunk_start + TOKENIZE_CHUNK
        rows, cut = encode_rows(
            tokenizer,
            texts[chunk_start:chunk_end],
            None if pairs is None else pairs[chunk_start:chunk_end],
            max_length=max_length,
        )
        check_truncation(cut, max_length, truncate, offset=chunk_start, param=param)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]["input_ids"]))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            yield [chunk_start + i for i in idx], collate(tokenizer, [rows[i] for i in idx], [cut[i] for i in idx])
