"""Deterministic stand-ins for an encoder and a cross-encoder: no weights, no torch, microseconds per text.

They have the interface the serving layer uses (``encode_batch``/``score_batch``, ``count_tokens``,
``spec``, ``max_seq_length``), so the whole HTTP service can be tested and demonstrated without loading
a model (as Infinity's dummy engine does). Tokens are lowercase words and punctuation marks, plus two
special tokens per text (three per pair), and inputs are cut at ``max_seq_length`` tokens, so token counts
and truncation flags behave as a real model's do.

- :class:`FakeEncoder`: each word adds a signed unit to a hashed position (feature hashing), then the
  vector is L2-normalized. Texts sharing words get a positive cosine.
- :class:`FakeCrossEncoder`: the share of query words that occur in the document, in ``[0, 1]``.

>>> enc = FakeEncoder(dimension=8, max_seq_length=4)
>>> out = enc.encode_batch(["a b", "a b c d e"])
>>> out.token_counts, out.truncated, out.values.shape
([4, 4], [False, True], (2, 8))
>>> FakeCrossEncoder().score_batch([("red apple", "an apple"), ("red apple", "pear")]).values.tolist()
[0.5, 0.0]
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from embedrank.errors import ModelNotFoundError
from embedrank.math.pooling import PoolingMode
from embedrank.math.similarity import finish_vectors
from embedrank.models.prompts import select_prompt, with_prompt
from embedrank.models.ranges import FitsRanges, RangeSample
from embedrank.models.tokens import TokenRow, TokenSpan, with_adapter
from embedrank.registry import ModelKind, ModelSpec
from embedrank.runtime.lora import AdapterNames
from embedrank.texts import vocabulary_texts
from embedrank.types import ModelOutput

_TOKEN = re.compile(r"\w+|[^\w\s]")


def words(text: str) -> list[str]:
    """The fake tokenizer: lowercase words and single punctuation marks.

    >>> words("Hello, World!")
    ['hello', ',', 'world', '!']
    """
    return _TOKEN.findall(text.lower())


def word_offsets(texts: Sequence[str]) -> list[list[tuple[int, int]]]:
    """Character spans of the fake tokenizer's tokens (for chunking).

    >>> word_offsets(["Hi, you"])
    [[(0, 2), (2, 3), (4, 7)]]
    """
    return [[(m.start(), m.end()) for m in _TOKEN.finditer(t)] for t in texts]


def _slot(word: str, dimension: int) -> tuple[int, float]:
    digest = hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    return value % dimension, 1.0 if (value >> 63) & 1 else -1.0


def _spec(model_id: str, kind: ModelKind, max_seq_length: int, dimension: int | None, **more: Any) -> ModelSpec:
    """A fake's :class:`ModelSpec`: no files, no pooling unless given."""
    fields: dict[str, Any] = {"pooling": None, "normalize": False, **more}
    return ModelSpec(
        model_id=model_id,
        path=f"<fake:{model_id}>",
        source="fake",
        kind=kind,
        max_seq_length=max_seq_length,
        dimension=dimension,
        **fields,
    )


def _word_rows(texts: Sequence[str], max_seq_length: int) -> list[TokenRow]:
    """Words kept under the maximum length, with the two special tokens counted."""
    rows = []
    for text in texts:
        tokens = words(text)
        kept = tokens[: max_seq_length - 2]
        rows.append(TokenRow(kept, len(kept) + 2, len(kept) < len(tokens)))
    return rows


class WordTokens:
    """A fake model's token accounting: words between two special tokens, cut at ``max_seq_length``."""

    spec: ModelSpec
    max_seq_length: int

    def count_tokens(
        self, texts: Sequence[str], *, prompt_name: str | None = None, prompt: str | None = None
    ) -> list[int]:
        chosen = select_prompt(self.spec.prompts, self.spec.default_prompt_name, prompt_name=prompt_name, prompt=prompt)
        return [len(words(t)) + 2 for t in with_prompt(texts, chosen)]

    def tokens(
        self, texts: Sequence[str], *, prompt_name: str | None = None, prompt: str | None = None, truncate: bool = True
    ) -> list[list[str]]:
        chosen = select_prompt(self.spec.prompts, self.spec.default_prompt_name, prompt_name=prompt_name, prompt=prompt)
        out = [["[CLS]", *words(t), "[SEP]"] for t in with_prompt(texts, chosen)]
        return [
            [*t[: self.max_seq_length - 1], "[SEP]"] if truncate and len(t) > self.max_seq_length else t for t in out
        ]

    def token_spans(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[TokenSpan]]:
        """Words with their spans, ids from the vocabulary hash, between ``[CLS]`` (101) and ``[SEP]`` (102)."""
        out = []
        for text, spans in zip(texts, word_offsets(texts), strict=True):
            row = [TokenSpan(_slot(text[a:b], 30000)[0] + 1000, text[a:b], False, a, b) for a, b in spans]
            ends = (TokenSpan(101, "[CLS]", True, None, None), TokenSpan(102, "[SEP]", True, None, None))
            out.append([ends[0], *row, ends[1]] if add_special_tokens else row)
        return out


class NamedAdapters:
    """A fake's LoRA adapters by name (:attr:`adapters`, none by default): their indexes are what its rows carry,
    and an unknown one is refused as a real model refuses it."""

    adapters: tuple[str, ...] = ()

    def adapter_index(self, adapter: str | None) -> int:
        """The index of ``adapter`` in :attr:`adapters` (None: -1, the base model).

        Raises:
            InvalidInputError: the fake has no adapter of that name (the message lists those it has).
        """
        return AdapterNames(self.adapters).index(adapter)


class FakeEncoder(WordTokens, FitsRanges, NamedAdapters):
    """A bag-of-words feature-hashing encoder with a real model's interface and token accounting."""

    def __init__(
        self,
        model_id: str = "fake-encoder",
        *,
        dimension: int = 32,
        max_seq_length: int = 32,
        normalize: bool = True,
        prompts: dict[str, str] | None = None,
        adapters: Sequence[str] = (),
    ) -> None:
        self.adapters = tuple(adapters)  # each adapter salts the hashed words: other vectors, as a LoRA update gives
        self.adapter_folders: dict[str, str] = {}
        self.spec = _spec(
            model_id,
            "embedding",
            max_seq_length,
            dimension,
            pooling=PoolingMode.MEAN,
            normalize=normalize,
            prompts=dict(prompts or {}),
        )
        self.model_id, self.dimension, self.max_seq_length, self.normalize = (
            model_id,
            dimension,
            max_seq_length,
            normalize,
        )
        self.pooling = PoolingMode.MEAN
        self._range_sample: RangeSample | None = None

    @property
    def document_prompt(self) -> str:
        """The prompt a document gets (an encoder's document prompt), "" when it has none."""
        return self.spec.prompts.get("document") or self.spec.prompts.get("passage") or ""

    def token_offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        return word_offsets(texts)

    def chunk_window(self, prompt: str | None = None) -> int:
        if prompt is None:
            prompt = select_prompt(
                self.spec.prompts, None, prompt_name="passage" if "passage" in self.spec.prompts else None
            )
        return max(1, self.max_seq_length - 2 - len(words(prompt)))

    def default_range_texts(self) -> list[str]:
        """1,000 pseudo-sentences over the fake's 512-word vocabulary (its words are not English, so a real
        encoder's default, the packaged sample, would all be unknown words to it)."""
        return vocabulary_texts(["".join(w) for w in itertools.product("abcdefgh", repeat=3)])

    def embed_for_ranges(self, texts: list[str], *, normalize: bool, adapter: str | None = None) -> np.ndarray:
        return self.encode(texts, adapter=adapter)

    def encode_batch(self, texts: Sequence[str]) -> ModelOutput:
        out = self.embed_rows(self.tokenize_rows(texts))
        return ModelOutput(self.finish_vectors(out.values), out.token_counts, out.truncated)

    def prompt_skip(self, prompt: str) -> int:
        return 0  # a fake pools every token

    def tokenize_rows(self, texts: Sequence[str], *, prompt: str = "", adapter: str | None = None) -> list[TokenRow]:
        """Words (``prompt``'s first) kept under the maximum length, with the two special tokens counted; each row
        marked with ``adapter``'s index."""
        return with_adapter(_word_rows(with_prompt(texts, prompt), self.max_seq_length), self.adapter_index(adapter))

    def embed_rows(self, rows: Sequence[TokenRow]) -> ModelOutput:
        """The rows' vectors before :meth:`finish_vectors` (each row's words salted by its adapter's name)."""
        out = np.zeros((len(rows), self.dimension), dtype=np.float32)  # (N, D)
        for i, row in enumerate(rows):
            salt = "" if row.adapter < 0 else f"#{self.adapters[row.adapter]}"
            for word in row.tokens:
                slot, sign = _slot(word + salt, self.dimension)
                out[i, slot] += sign
        return ModelOutput(out, [r.length for r in rows], [r.truncated for r in rows])

    def finish_vectors(
        self, pooled: np.ndarray, *, normalize: bool | None = None, dimensions: int | None = None
    ) -> np.ndarray:
        return finish_vectors(
            pooled, normalize=self.normalize if normalize is None else normalize, dimensions=dimensions
        )

    def encode(self, texts: Sequence[str], *, adapter: str | None = None, **_: object) -> np.ndarray:
        out = self.embed_rows(self.tokenize_rows(list(texts), adapter=adapter))
        return self.finish_vectors(out.values)


class FakeCrossEncoder(NamedAdapters):
    """Scores a pair by the share of query words found in the document, with a cross-encoder's accounting; with
    ``adapters``, a pair that runs with the adapter at index ``i`` scores ``share / 2**(i + 1) + (i + 1) / 10``
    (other scores, as a LoRA adapter and its head give)."""

    def __init__(
        self, model_id: str = "fake-cross-encoder", *, max_seq_length: int = 64, adapters: Sequence[str] = ()
    ) -> None:
        self.spec = _spec(model_id, "cross-encoder", max_seq_length, None, num_labels=1)
        self.model_id, self.max_seq_length = model_id, max_seq_length
        self.adapters = tuple(adapters)

    def count_tokens(self, queries: Sequence[str], documents: Sequence[str]) -> list[int]:
        return [len(words(q)) + len(words(d)) + 3 for q, d in zip(queries, documents, strict=True)]

    def token_offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        return word_offsets(texts)

    def chunk_window(self, query: str) -> int:
        return max(4, self.max_seq_length - 3 - len(words(query)))

    def score_batch(self, pairs: Sequence[tuple[str, str]]) -> ModelOutput:
        return self.score_rows(self.tokenize_rows(pairs))

    def tokenize_rows(self, pairs: Sequence[tuple[str, str]], *, adapter: str | None = None) -> list[TokenRow]:
        """Query and document words, cut ``longest_first`` as Hugging Face tokenizers cut pairs, each row with the
        index of ``adapter`` (-1: none)."""
        index = self.adapter_index(adapter)
        rows = []
        for query, document in pairs:
            q, d = words(query), words(document)
            full = len(q) + len(d) + 3
            budget = self.max_seq_length - 3
            while len(q) + len(d) > budget:
                if len(d) >= len(q):
                    d = d[:-1]
                else:
                    q = q[:-1]
            rows.append(TokenRow((q, d), len(q) + len(d) + 3, len(q) + len(d) + 3 < full, adapter=index))
        return rows

    def score_rows(self, rows: Sequence[TokenRow], *, apply_activation: bool = True) -> ModelOutput:
        """The share of query words in the document (no activation: raw scores are the scores)."""
        scores = []
        for row in rows:
            q, d = row.tokens
            seen = set(d)
            share = sum(w in seen for w in q) / len(q) if q else 0.0
            scores.append(share if row.adapter < 0 else share / 2 ** (row.adapter + 1) + (row.adapter + 1) / 10)
        return ModelOutput(np.asarray(scores, dtype=np.float32), [r.length for r in rows], [r.truncated for r in rows])


class FakeSparseEncoder(WordTokens, NamedAdapters):
    """A SPLADE stand-in: each word of a text weighs ``1 + len(word) / 10`` at its hashed vocabulary slot (the
    largest where words collide), with a real model's token accounting (two special tokens, words cut at the
    window)."""

    def __init__(self, model_id: str = "fake-sparse", *, vocab_size: int = 1000, max_seq_length: int = 32) -> None:
        self.spec = _spec(model_id, "sparse", max_seq_length, vocab_size)
        self.model_id, self.vocab_size, self.max_seq_length = model_id, vocab_size, max_seq_length

    def tokenize_rows(self, texts: Sequence[str], *, adapter: str | None = None) -> list[TokenRow]:
        return with_adapter(_word_rows(texts, self.max_seq_length), self.adapter_index(adapter))

    def weights_rows(self, rows: Sequence[TokenRow]) -> ModelOutput:
        out = np.zeros((len(rows), self.vocab_size), dtype=np.float32)  # (N, V)
        for i, row in enumerate(rows):
            for word in row.tokens:
                slot = _slot(word, self.vocab_size)[0]
                out[i, slot] = max(out[i, slot], 1.0 + len(word) / 10)
        return ModelOutput(out, [r.length for r in rows], [r.truncated for r in rows])


FAKE_PROMPTS = {"query": "query: ", "passage": "passage: "}  # e5-style, for fake:encoder-with-prompts
# jina-embeddings-v3's task adapters, for fake:encoder-with-adapters
FAKE_ADAPTERS = ("retrieval.query", "retrieval.passage", "text-matching")
FAKE_RERANK_ADAPTERS = ("support", "legal")  # a reranker's own fine-tunes, for fake:cross-encoder-with-adapters
FAKE_ADAPTER_PROMPTS = {"retrieval.query": "Represent the query for retrieving evidence documents: "}
FAKE_PATHS = (
    "fake:encoder",
    "fake:encoder-with-prompts",
    "fake:encoder-with-adapters",
    "fake:cross-encoder",
    "fake:cross-encoder-with-adapters",
    "fake:sparse",
    "fake:zero-forward",
)


def fake_model(model_id: str, path: str) -> Any:
    """The stand-in a served model's ``path`` names: ``fake:encoder``, ``fake:encoder-with-prompts``
    (e5-style query and passage prompts, to try ``input_type``), ``fake:encoder-with-adapters`` (jina-embeddings-v3's
    task adapters, :data:`FAKE_ADAPTERS`, to try ``adapter`` and ``task``), ``fake:cross-encoder`` (with
    ``-with-adapters``: :data:`FAKE_RERANK_ADAPTERS`, to try a reranking request's ``adapter``) or ``fake:sparse``, all
    weightless; or ``fake:zero-forward``, the packaged MiniLM's tokenizer with a forward pass that costs nothing
    (:mod:`embedrank.testing.zero_forward`).

    >>> fake_model("demo", "fake:encoder-with-prompts").spec.prompts
    {'query': 'query: ', 'passage': 'passage: '}
    """
    if path == "fake:encoder":
        return FakeEncoder(model_id)
    if path == "fake:encoder-with-prompts":
        return FakeEncoder(model_id, prompts=FAKE_PROMPTS)
    if path == "fake:encoder-with-adapters":
        return FakeEncoder(model_id, prompts=FAKE_ADAPTER_PROMPTS, adapters=FAKE_ADAPTERS)
    if path == "fake:cross-encoder":
        return FakeCrossEncoder(model_id)
    if path == "fake:cross-encoder-with-adapters":
        return FakeCrossEncoder(model_id, adapters=FAKE_RERANK_ADAPTERS)
    if path == "fake:sparse":
        return FakeSparseEncoder(model_id)
    if path == "fake:zero-forward":
        from embedrank.testing.zero_forward import zero_forward_encoder

        return zero_forward_encoder(model_id)
    raise ModelNotFoundError(f"unknown fake model {path!r}; use {', '.join(FAKE_PATHS)}")
