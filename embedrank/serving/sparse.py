"""A SPLADE model behind a :class:`~embedrank.serving.engine.BatchEngine`: texts from many requests share
forward passes; each request gets its sparse vectors back as one ``scipy.sparse.csr_matrix`` ``(N, V)``.
The runner takes the embedding runners' keyword arguments and refuses those that do not apply."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial
from typing import Any, Protocol, runtime_checkable

import numpy as np
import scipy.sparse as sp

from embedrank.math.sparse import to_csr
from embedrank.models.checks import too_long_error
from embedrank.models.prompts import with_prompt
from embedrank.models.tokens import TokenRow, TokenSpan
from embedrank.registry import ModelSpec
from embedrank.serving import tracing
from embedrank.serving.engine import BatchEngine, EngineConfig
from embedrank.serving.inputs import check_budget, first_cut
from embedrank.serving.options import EMBED_DEFAULTS, EmbedOptions, Refusal, refuse
from embedrank.serving.runners import AdapterSignatures, EncoderTokens
from embedrank.serving.vector_cache import (
    CachedVector,
    VectorCache,
    cache_key,
    missing,
    packed_sparse,
    unpacked_sparse,
    would_fail,
)
from embedrank.types import ModelOutput


@runtime_checkable
class SparseModel(Protocol):
    spec: ModelSpec
    model_id: str
    max_seq_length: int

    @property
    def vocab_size(self) -> int: ...

    def tokenize_rows(self, texts: Sequence[str], *, adapter: str | None = None) -> list[TokenRow]: ...

    def weights_rows(self, rows: Sequence[TokenRow]) -> ModelOutput: ...

    def count_tokens(self, texts: Sequence[str], *, prompt: str = "") -> list[int]: ...

    def tokens(self, texts: Sequence[str], *, prompt: str = "", truncate: bool = True) -> list[list[str]]: ...

    def token_spans(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[TokenSpan]]: ...


class SparseBatchModel:
    """Batches of tokenized texts through a SPLADE model; each value is the text's weights ``(V,)``."""

    def __init__(self, model: SparseModel) -> None:
        self.model = model
        self.max_seq_length = model.max_seq_length

    def item_tokens(self, item: TokenRow) -> int:
        return item.length

    def run_batch(self, items: Sequence[TokenRow]) -> ModelOutput:
        return self.model.weights_rows(items)


class SparseOutput(ModelOutput):
    """One request's sparse vectors with what the model saw of each input: :attr:`sparse` (the name bge-m3's
    output gives its lexical weights) is ``values``, a ``scipy.sparse.csr_matrix`` ``(N, V)``. A SPLADE has no
    dense vector: :attr:`embeddings` is empty, ``(N, 0)``."""

    @property
    def sparse(self) -> sp.csr_matrix:
        return self.values  # type: ignore[return-value]

    @property
    def embeddings(self) -> np.ndarray:
        return np.zeros((self.values.shape[0], 0), dtype=np.float32)


REFUSED = (
    Refusal("chunking", "SPLADE models return one vector per text; chunking does not apply"),
    Refusal("truncation_side", "SPLADE models cut over-long texts at the end only", lambda side: side != "right"),
    Refusal("dimensions", "a SPLADE vector spans the vocabulary; dimensions does not apply"),
    Refusal("normalize", "SPLADE weights are returned as the model computes them, unnormalized"),
)
"""The embedding options a SPLADE model refuses."""


class AsyncSparseEncoder(EncoderTokens, AdapterSignatures):
    """Sparse (SPLADE) embeddings through a :class:`BatchEngine`; token counting as any encoder's."""

    def __init__(self, model: SparseModel, config: EngineConfig | None = None, **engine_kwargs: Any) -> None:
        self.model = self.encoder = model
        self.engine: BatchEngine[TokenRow] = BatchEngine(SparseBatchModel(model), config, **engine_kwargs)
        self.cache: VectorCache | None = None  # computed sparse vectors by text, for requests that ask (``cached``)
        self.cache_signature = ""  # what the vectors depend on besides the prompt and the text

    @property
    def max_seq_length(self) -> int:
        return self.model.max_seq_length

    @property
    def dimension(self) -> int:
        return self.model.vocab_size

    async def embed(
        self,
        texts: Sequence[str],
        options: EmbedOptions = EMBED_DEFAULTS,
        *,
        prompt: str = "",
        top_k: int | None = None,
        adapter: str | None = None,
    ) -> SparseOutput:
        """The sparse vectors of ``prompt + text`` for each text, in input order (each text's ``top_k``
        heaviest terms with ``top_k``), run with the model's LoRA ``adapter`` (None: the base model). With
        ``truncate`` off a text over the window is refused before it is queued, as are requests over ``budget``
        tokens. :data:`REFUSED`: what does not apply to a vector over the vocabulary."""
        refuse(options, *REFUSED)
        if options.cached and self.cache is not None and top_k is None:
            found = await self._embed_cached(self.cache, texts, prompt, options, adapter)
            if found is not None:
                return found
        texts = with_prompt(texts, prompt)
        with tracing.tokenizing(len(texts)):
            rows = await asyncio.to_thread(partial(self.model.tokenize_rows, list(texts), adapter=adapter))
        check_budget(rows, options.budget)
        at = None if options.truncate else first_cut(rows)
        if at is not None:
            raise too_long_error(at, self.max_seq_length, param=options.fields.texts)
        out = await self.engine.submit(rows, priority=options.priority)
        vectors = await asyncio.to_thread(partial(to_csr, out.values, top_k))
        return SparseOutput(vectors, list(out.token_counts), list(out.truncated))  # type: ignore[arg-type]

    async def _embed_cached(
        self, cache: VectorCache, texts: Sequence[str], prompt: str, options: EmbedOptions, adapter: str | None = None
    ) -> SparseOutput | None:
        """What :meth:`embed` gives, computing only the texts ``cache`` lacks (each distinct one once, then
        stored; a cached text's token count and truncation come from the cache). None, and nothing computed,
        when the request would fail (over ``budget``, or a text cut with ``truncate`` off): :meth:`embed` then
        runs it uncached, which fails it with the error it would get."""
        keys = [cache_key(self._signature(adapter), prompt, "right", text) for text in texts]
        found = await asyncio.to_thread(cache.get_many, keys)
        todo = missing(keys, found)
        rows: list[TokenRow] = []
        if todo:
            lacking = with_prompt([texts[i] for i in todo.values()], prompt)
            with tracing.tokenizing(len(lacking)):
                rows = await asyncio.to_thread(partial(self.model.tokenize_rows, lacking, adapter=adapter))
        fresh = {key: (row.length, row.truncated) for key, row in zip(todo, rows, strict=True)}
        seen = [(hit.tokens, hit.truncated) if (hit := found.get(key)) is not None else fresh[key] for key in keys]
        if would_fail(seen, options.budget, options.truncate):
            return None
        vectors = {key: unpacked_sparse(hit.vector) for key, hit in found.items()}
        stored = []
        if todo:
            out = await self.engine.submit(rows, priority=options.priority)
            computed = await asyncio.to_thread(partial(to_csr, out.values, None))
            for n, key in enumerate(todo):
                row = computed[n]
                vectors[key] = (row.indices.astype(np.int32), row.data.astype(np.float32))
                stored.append((key, CachedVector(packed_sparse(*vectors[key]), out.token_counts[n], fresh[key][1])))
        await cache.keep(stored)
        matrix = _rows_matrix([vectors[key] for key in keys], self.dimension)
        return SparseOutput(matrix, [t for t, _ in seen], [c for _, c in seen])  # type: ignore[arg-type]


def _rows_matrix(rows: Sequence[tuple[np.ndarray, np.ndarray]], width: int) -> sp.csr_matrix:
    """``(N, width)`` float32 CSR of each row's ``(indices, values)``."""
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    indptr[1:] = np.cumsum([len(i) for i, _ in rows])
    indices = np.concatenate([i for i, _ in rows]) if rows else np.empty(0, dtype=np.int32)
    values = np.concatenate([v for _, v in rows]) if rows else np.empty(0, dtype=np.float32)
    return sp.csr_matrix((values, indices, indptr), shape=(len(rows), width))
