"""Model runners: an encoder or a cross-encoder behind a :class:`~embedrank.serving.engine.BatchEngine`.

:class:`AsyncEncoder` serves embeddings and bi-encoder (cosine) reranking, :class:`AsyncCrossEncoder`
cross-encoder reranking. Both answer with a :class:`~embedrank.types.ModelOutput` in input order.
Inputs are tokenized once, in a worker thread, when a request is submitted: the engine budgets batches
on their real lengths and the model pads the rows it gets. With ``truncate=False`` an input cut at the
maximum length is refused before it is queued, naming the request field and position (``input[3]``,
``query``, ``documents[2]``).

Any model with the methods the batch models call works: :class:`~embedrank.models.encoder.Encoder` and
:class:`~embedrank.models.cross_encoder.CrossEncoder`, or the weightless fakes in
:mod:`embedrank.testing.fake` that the HTTP tests use.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from functools import partial
from typing import Any, Protocol, runtime_checkable

import numpy as np

from embedrank.errors import InvalidInputError
from embedrank.math.similarity import check_dimensions, cosine_scores, l2_normalize
from embedrank.models.checks import too_long_error
from embedrank.models.prompts import DOCUMENT_NAMES, QUERY_NAMES, role_prompt, with_prompt
from embedrank.models.ranges import RangeSample
from embedrank.models.tokens import TokenRow, TokenSpan
from embedrank.registry import ModelSpec, weights_fingerprint
from embedrank.serving import tracing
from embedrank.serving.engine import BatchEngine, EngineConfig
from embedrank.serving.inputs import check_budget, cut_starts, field_of, first_cut, plan_chunks
from embedrank.serving.options import EMBED_DEFAULTS, RERANK_DEFAULTS, EmbedOptions, RerankOptions
from embedrank.serving.vector_cache import CachedVector, VectorCache, cache_key, missing, would_fail
from embedrank.types import ModelOutput


@runtime_checkable
class EmbeddingModel(Protocol):
    spec: ModelSpec
    model_id: str
    dimension: int
    max_seq_length: int
    normalize: bool

    def count_tokens(
        self, texts: Sequence[str], *, prompt_name: str | None = None, prompt: str | None = None
    ) -> list[int]: ...

    def tokens(
        self, texts: Sequence[str], *, prompt_name: str | None = None, prompt: str | None = None, truncate: bool = True
    ) -> list[list[str]]: ...

    def tokenize_rows(
        self, texts: Sequence[str], *, prompt: str = "", adapter: str | None = None
    ) -> list[TokenRow]: ...

    def prompt_skip(self, prompt: str) -> int: ...

    def embed_rows(self, rows: Sequence[TokenRow]) -> ModelOutput: ...

    def finish_vectors(
        self, pooled: np.ndarray, *, normalize: bool | None = None, dimensions: int | None = None
    ) -> np.ndarray: ...

    def token_offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]: ...

    def token_spans(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[TokenSpan]]: ...

    def chunk_window(self, prompt: str | None = None) -> int: ...

    def quantization_ranges(
        self, dimensions: int | None = None, *, normalize: bool | None = None, adapter: str | None = None
    ) -> np.ndarray: ...

    def range_sample_of(self, adapter: str | None) -> RangeSample: ...


@runtime_checkable
class PairScorer(Protocol):
    spec: ModelSpec
    model_id: str
    max_seq_length: int

    def count_tokens(self, queries: Sequence[str], documents: Sequence[str]) -> list[int]: ...

    def tokenize_rows(self, pairs: Sequence[tuple[str, str]], *, adapter: str | None = None) -> list[TokenRow]: ...

    def score_rows(self, rows: Sequence[TokenRow], *, apply_activation: bool = True) -> ModelOutput: ...

    def token_offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]: ...

    def chunk_window(self, query: str) -> int: ...


class EmbeddingBatchModel:
    """Batches of tokenized texts through an encoder; each value is a float32 vector ``(D,)`` before the
    model's normalization (requests in one batch may differ in it: the runner normalizes per request)."""

    def __init__(self, encoder: EmbeddingModel) -> None:
        self.encoder = encoder
        self.max_seq_length = encoder.max_seq_length

    def item_tokens(self, item: TokenRow) -> int:
        return item.length

    def run_batch(self, items: Sequence[TokenRow]) -> ModelOutput:
        return self.encoder.embed_rows(items)


def activation_of(cross_encoder: Any) -> str | None:
    """The activation a one-label cross-encoder applies to its raw scores (None: none, or several labels,
    whose relevance is a softmax probability and has no raw form)."""
    if getattr(cross_encoder, "num_labels", 1) != 1:
        return None
    name = getattr(cross_encoder, "activation", "Identity")
    return None if name == "Identity" else name


class CrossEncoderBatchModel:
    """Batches of tokenized (query, document) pairs through a cross-encoder; each value is a score, raw
    for a one-label model with an activation (requests in one batch may differ in wanting raw scores: the
    runner applies the activation per request)."""

    def __init__(self, cross_encoder: PairScorer) -> None:
        self.cross_encoder = cross_encoder
        self.max_seq_length = cross_encoder.max_seq_length
        self.raw = activation_of(cross_encoder) is not None

    def item_tokens(self, item: TokenRow) -> int:
        return item.length

    def run_batch(self, items: Sequence[TokenRow]) -> ModelOutput:
        out = self.cross_encoder.score_rows(items, apply_activation=not self.raw)
        return ModelOutput(out.values.reshape(len(items)), out.token_counts, out.truncated)  # (B,) relevance


# Requests whose texts total at most this many characters are tokenized on the event loop (tens of
# microseconds), longer ones in a worker thread: the thread hop cost more than the tokenizing for one short
# query (eval/benchmarks/service.py, int8, 32 clients x 1 query: 8% more requests per second, p50 35 ms against 42)
INLINE_TOKENIZE_CHARS = 2048
# Requests of at most this many texts look them up in the embedding cache on the event loop (an SQLite read
# by primary key, about 20 microseconds each), larger ones in a worker thread: a batch of 20,000 one-text
# lines run again from the cache took 5.2 s with a thread hop per line, 4.8 s without (2-core AMD EPYC)
INLINE_LOOKUP_KEYS = 8


class EncoderTokens:
    """``count``, ``token_spans`` (``/v1/tokenize``, TEI's ``/tokenize``) and ``token_offsets`` (a store's chunks) for
    a runner over an ``encoder``."""

    encoder: Any

    async def count(
        self, texts: Sequence[str], *, prompt: str = "", return_tokens: bool = False
    ) -> tuple[list[int], list[list[str]] | None]:
        """Untruncated token counts of ``prompt + text`` (what :meth:`embed` would see before truncation),
        and on request the tokens the model sees (cut at the max length), in a worker thread."""
        texts = with_prompt(texts, prompt)
        counts = await asyncio.to_thread(partial(self.encoder.count_tokens, texts, prompt=""))
        tokens = await asyncio.to_thread(partial(self.encoder.tokens, texts, prompt="")) if return_tokens else None
        return counts, tokens

    async def token_spans(
        self, texts: Sequence[str], *, prompt: str = "", add_special_tokens: bool = True
    ) -> list[list[TokenSpan]]:
        """Every token of ``prompt + text`` with its id and character span, untruncated, in a worker thread."""
        return await asyncio.to_thread(
            partial(self.encoder.token_spans, with_prompt(texts, prompt), add_special_tokens=add_special_tokens)
        )

    async def token_offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Each text's tokens as character spans (no special tokens, untruncated), in a worker thread: what a long
        document's windows are cut on, at 16 bytes a token where :meth:`token_spans` keeps an object each."""
        return await asyncio.to_thread(self.encoder.token_offsets, texts)


class AdapterSignatures:
    """The embedding cache's key of a runner's vectors: its model's signature (:attr:`cache_signature`) and, for
    vectors of a LoRA adapter, the adapter's name, folder and weights."""

    encoder: Any
    cache_signature: str = ""

    def _signature(self, adapter: str | None) -> str:
        """What the vectors depend on besides the prompt, the truncation and the text: the model's signature, and
        the adapter's name, folder and weights (an adapter saved again at its place gives other vectors)."""
        if adapter is None:
            return self.cache_signature
        signatures: dict[str, str] = self.__dict__.setdefault("_adapter_signatures", {})
        found = signatures.get(adapter)
        if found is None:  # once per adapter: the weights' fingerprint reads the folder
            folder = getattr(self.encoder, "adapter_folders", {}).get(adapter, "")
            fingerprint = weights_fingerprint(folder) if folder else ""
            found = signatures[adapter] = f"{self.cache_signature}|adapter={adapter}:{folder}:{fingerprint}"
        return found


class AsyncEncoder(EncoderTokens, AdapterSignatures):
    """Embeddings and bi-encoder (cosine) reranking through a :class:`BatchEngine`."""

    def __init__(self, encoder: EmbeddingModel, config: EngineConfig | None = None, **engine_kwargs: Any) -> None:
        self.encoder = encoder
        self.engine: BatchEngine[TokenRow] = BatchEngine(EmbeddingBatchModel(encoder), config, **engine_kwargs)
        self.cache: VectorCache | None = None  # computed vectors by text, for requests that ask (``cached``)
        self.cache_signature = ""  # what the vectors depend on besides the prompt, the truncation and the text

    @property
    def dimension(self) -> int:
        return self.encoder.dimension

    @property
    def max_seq_length(self) -> int:
        return self.encoder.max_seq_length

    async def _rows(
        self,
        texts: Sequence[str],
        fields: Sequence[tuple[str, int]] = (),
        *,
        prompt: str = "",
        budget: int | None = None,
        adapter: str | None = None,
    ) -> list[TokenRow]:
        """``texts`` tokenized once with ``prompt`` before each (the model's step), off the event loop, each row
        marked with ``adapter``'s index. With ``fields`` (truncation off), the first of the texts they cover that is
        cut at the maximum length is refused, named by request field."""
        tokenize = partial(self.encoder.tokenize_rows, texts, prompt=prompt)
        if adapter is not None:  # an encoder with adapters; other models' rows take no adapter
            tokenize = partial(tokenize, adapter=adapter)
        if sum(map(len, texts)) <= INLINE_TOKENIZE_CHARS:  # a few short texts: cheaper than the thread hop
            rows = tokenize()  # microseconds: a span would cost more
        else:
            with tracing.tokenizing(len(texts)):
                rows = await asyncio.to_thread(tokenize)
        check_budget(rows, budget)
        at = first_cut(rows, sum(size for _, size in fields)) if fields else None
        if at is not None:
            (length,) = await asyncio.to_thread(partial(self.encoder.count_tokens, [texts[at]], prompt=prompt))
            name, index = field_of(at, fields)
            raise too_long_error(index, self.max_seq_length, param=name, tokens=length)
        return rows

    async def embed(
        self,
        texts: Sequence[str],
        options: EmbedOptions = EMBED_DEFAULTS,
        *,
        prompt: str = "",
        adapter: str | None = None,
    ) -> ModelOutput:
        """Vectors ``(N, D)`` (or ``(N, options.dimensions)``, cut then renormalized) in input order, with every
        option of :class:`~embedrank.serving.options.EmbedOptions`; ``prompt`` goes before every text (the
        model sees and counts it); the texts run with the model's LoRA ``adapter`` (None: the base model), rows
        of requests for different adapters sharing the engine's batches. With ``chunking``, long texts are embedded window by window and pooled, as
        ``Encoder.encode_with_stats``. A left-truncated text keeps its last tokens, the prompt stays first.
        ``budget`` is checked after tokenizing and chunking (:class:`~embedrank.errors.RequestTooLargeError`,
        before anything is queued). ``cached`` (with a :attr:`cache`): texts whose vectors it holds are neither
        tokenized nor computed again (their token counts and truncation come from the cache; a request that
        would fail runs uncached, so it answers and fails as it would uncached); chunked texts are always
        computed. Normalization and the cut to ``dimensions`` are the model's own
        (:meth:`~embedrank.models.encoder.Encoder.finish_vectors`)."""
        check_dimensions(options.dimensions, self.dimension, options.fields.dimensions)
        if options.chunking is not None:
            norm = self.encoder.normalize if options.normalize is None else options.normalize
            out = await self._embed_chunked(texts, prompt, options, norm=norm, adapter=adapter)
        elif options.cached and self.cache is not None:
            # no cache hit list when the request would fail: it then fails as it would uncached
            out = await self._embed_cached(self.cache, texts, prompt, options, adapter) or await self._embed_texts(
                texts, prompt, options, adapter
            )
        else:
            out = await self._embed_texts(texts, prompt, options, adapter)
        vectors = self.encoder.finish_vectors(out.values, normalize=options.normalize, dimensions=options.dimensions)
        return dataclasses.replace(out, values=vectors)

    async def _embed_texts(
        self, texts: Sequence[str], prompt: str, options: EmbedOptions, adapter: str | None = None
    ) -> ModelOutput:
        """Every text tokenized, checked (the request's budget; with ``truncate`` off, the first text cut at
        the window, named by the request's field) and computed: the vectors before normalization, in input
        order."""
        param = options.fields.texts
        fields = () if options.truncate else [(param, len(texts))]
        rows = await self._rows(texts, fields, prompt=prompt, budget=options.budget, adapter=adapter)
        started: set[int] = set()
        if options.truncate and options.truncation_side == "left":
            rows, started = await self._cut_at_start(texts, rows, prompt, param, adapter)
        out = await self.engine.submit(rows, priority=options.priority)
        flags = [cut or i in started for i, cut in enumerate(out.truncated)] if started else out.truncated
        return ModelOutput(out.values, out.token_counts, flags)

    async def _embed_cached(
        self, cache: VectorCache, texts: Sequence[str], prompt: str, options: EmbedOptions, adapter: str | None = None
    ) -> ModelOutput | None:
        """What :meth:`_embed_texts` gives, computing only the texts ``cache`` lacks (each distinct one once,
        then stored) and tokenizing only those: a cached text's token count and truncation come from the
        cache. None, and nothing computed, when the request would fail (over ``budget``, or a text cut with
        ``truncate`` off): the caller runs it uncached, which fails it with the error it would get."""
        truncate, budget = options.truncate, options.budget
        keys = [cache_key(self._signature(adapter), prompt, options.truncation_side, text) for text in texts]
        if len(keys) <= INLINE_LOOKUP_KEYS:
            found = cache.get_many(keys)
        else:
            found = await asyncio.to_thread(cache.get_many, keys)
        todo = missing(keys, found)
        rows: list[TokenRow] = []
        started: set[int] = set()
        if todo:
            lacking = [texts[i] for i in todo.values()]
            try:
                rows = await self._rows(lacking, prompt=prompt, adapter=adapter)
                if truncate and options.truncation_side == "left":
                    rows, started = await self._cut_at_start(lacking, rows, prompt, options.fields.texts, adapter)
            except InvalidInputError:
                return None
        fresh = {
            key: (row.length, row.truncated or n in started)
            for n, (key, row) in enumerate(zip(todo, rows, strict=True))
        }
        seen = [(hit.tokens, hit.truncated) if (hit := found.get(key)) is not None else fresh[key] for key in keys]
        if would_fail(seen, budget, truncate):
            return None
        vectors = {key: hit.vector for key, hit in found.items()}
        stored = []
        if todo:
            computed = await self.engine.submit(rows, priority=options.priority)
            for n, key in enumerate(todo):
                vectors[key] = computed.values[n]
                stored.append((key, CachedVector(computed.values[n], computed.token_counts[n], fresh[key][1])))
        await cache.keep(stored)
        return ModelOutput(np.stack([vectors[key] for key in keys]), [t for t, _ in seen], [c for _, c in seen])

    async def _cut_at_start(
        self, texts: Sequence[str], rows: list[TokenRow], prompt: str, param: str, adapter: str | None = None
    ) -> tuple[list[TokenRow], set[int]]:
        """``rows`` with those cut at their end made again from their texts cut at the start instead (only
        those are tokenized again); returns the rows and the positions that were cut."""
        long = [i for i, row in enumerate(rows) if row.truncated]
        if not long:
            return rows, set()
        cut = await asyncio.to_thread(cut_starts, self.encoder, [texts[i] for i in long], prompt, param, long)
        rows = list(rows)
        for i, row in zip(long, await self._rows(cut, prompt=prompt, adapter=adapter), strict=True):
            rows[i] = row
        return rows, set(long)

    async def _embed_chunked(
        self, texts: Sequence[str], prompt: str, options: EmbedOptions, *, norm: bool, adapter: str | None = None
    ) -> ModelOutput:
        assert options.chunking is not None
        window = partial(self.encoder.chunk_window, prompt)
        plan = await plan_chunks(
            texts,
            self.encoder.token_offsets,
            window,
            options.chunking,
            options.truncate,
            options.fields.texts,
            options.budget,
        )
        rows = await self._rows(plan.texts, prompt=prompt, budget=options.budget, adapter=adapter)  # windows fit
        out = await self.engine.submit(rows, priority=options.priority)
        if norm:  # each window normalized, then their token-weighted mean renormalized
            out = dataclasses.replace(out, values=l2_normalize(out.values))
        return plan.vectors(out, normalize=norm)

    async def quantization_ranges(self, dimensions: int | None = None, *, adapter: str | None = None) -> np.ndarray:
        """int8/uint8 ranges ``(2, dimensions or D)`` from the model's range sample, by the base model or its LoRA
        ``adapter`` (computed once each, in a worker thread, outside the batching engine)."""
        if adapter is None:
            return await asyncio.to_thread(self.encoder.quantization_ranges, dimensions)
        sample = self.encoder.range_sample_of(adapter)
        if sample.computed is None:  # once: the sample's texts through the engine (a front's model has no weights)
            rows = await self._rows(sample.texts, adapter=adapter)
            out = await self.engine.submit(rows)
            sample.adopt(self.encoder.finish_vectors(out.values))
        return await asyncio.to_thread(partial(self.encoder.quantization_ranges, dimensions, adapter=adapter))

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        options: RerankOptions = RERANK_DEFAULTS,
        *,
        query_runner: AsyncEncoder | None = None,
    ) -> ModelOutput:
        """Cosine between the query embedding and each document embedding, each with the model's query or
        document prompt if it has one; token counts cover the query (first) and every document (window).
        ``query_runner`` embeds the query when another model does (a Router model's query branch).

        With ``chunking``, long documents are split into windows (:mod:`embedrank.models.chunking`), all
        windows go through the engine as one job, and each document gets the aggregate of its windows'
        scores; ``truncated`` then flags the documents whose text past the chunking bounds was left out.
        ``raw_scores`` changes nothing: a cosine has no activation."""
        truncate, priority, chunking, budget = options.truncate, options.priority, options.chunking, options.budget
        spec = self.encoder.spec
        query_text = role_prompt(spec.prompts, spec.default_prompt_name, QUERY_NAMES) + query
        document_prompt = role_prompt(spec.prompts, spec.default_prompt_name, DOCUMENT_NAMES)
        plan = None
        if chunking is not None:
            window = self.encoder.chunk_window
            plan = await plan_chunks(documents, self.encoder.token_offsets, window, chunking, truncate, budget=budget)
        docs = with_prompt(documents if plan is None else plan.texts, document_prompt)
        # truncation off: the query and (windows fit) unchunked documents are refused when cut
        fields = [("query", 1)] + ([("documents", len(documents))] if plan is None else [])
        if query_runner is None or query_runner is self:  # one job: the query and the documents
            rows = await self._rows([query_text, *docs], () if truncate else fields, budget=budget)
            out = await self.engine.submit(rows, priority=priority)
        else:
            rows = await self._rows(docs, () if truncate else fields[1:], budget=budget)
            asked = await query_runner._rows([query_text], () if truncate else fields[:1], budget=budget)
            q, d = await asyncio.gather(
                query_runner.engine.submit(asked, priority=priority), self.engine.submit(rows, priority=priority)
            )
            out = ModelOutput(
                np.concatenate([q.values, d.values]), q.token_counts + d.token_counts, q.truncated + d.truncated
            )
        cosines = cosine_scores(out.values[0], out.values[1:])
        if plan is None:
            return ModelOutput(cosines, out.token_counts, out.truncated)
        return plan.scores(cosines, out.token_counts, out.truncated[1:], leading_flags=out.truncated[:1])


class AsyncCrossEncoder:
    """Cross-encoder reranking through a :class:`BatchEngine`; pairs from many requests share batches."""

    dimension = None

    def __init__(self, cross_encoder: PairScorer, config: EngineConfig | None = None, **engine_kwargs: Any) -> None:
        self.cross_encoder = cross_encoder
        self.engine: BatchEngine[TokenRow] = BatchEngine(CrossEncoderBatchModel(cross_encoder), config, **engine_kwargs)

    @property
    def max_seq_length(self) -> int:
        return self.cross_encoder.max_seq_length

    async def rerank(
        self, query: str, documents: Sequence[str], options: RerankOptions = RERANK_DEFAULTS
    ) -> ModelOutput:
        """Scores ``(N,)`` of each (query, document) pair in input order; with ``chunking``, each document's
        windows (sized to fit next to the query) are scored as pairs and aggregated, as :class:`AsyncEncoder`.
        ``raw_scores``: before the model's activation (the same scores for a model without one).

        Raises:
            InvalidInputError: ``raw_scores`` for a model with several labels (its score is a probability).
        """
        truncate, priority, chunking, budget = options.truncate, options.priority, options.chunking, options.budget
        raw_scores = options.raw_scores
        if raw_scores and getattr(self.cross_encoder, "num_labels", 1) != 1:
            raise InvalidInputError(
                f"raw_scores: {self.cross_encoder.model_id!r} has several labels and scores by the probability of "
                "its relevance label, which has no raw form",
                param="raw_scores",
            )
        activation = None if raw_scores else activation_of(self.cross_encoder)
        if chunking is None:
            rows = await self._rows(query, documents, truncate, owners=None, budget=budget, adapter=options.adapter)
            out = await self.engine.submit(rows, priority=priority)
            values = out.values.astype(np.float32)
            if activation is not None:
                values = self.cross_encoder.activate(values)  # type: ignore[attr-defined]
            return ModelOutput(values, out.token_counts, out.truncated)
        window = partial(self.cross_encoder.chunk_window, query)
        plan = await plan_chunks(documents, self.cross_encoder.token_offsets, window, chunking, truncate, budget=budget)
        # a window fits beside the query unless the query leaves it too little room
        rows = await self._rows(
            query, plan.texts, truncate, owners=plan.windows.owners, budget=budget, adapter=options.adapter
        )
        out = await self.engine.submit(rows, priority=priority)
        values = out.values if activation is None else self.cross_encoder.activate(out.values)  # type: ignore[attr-defined]
        return plan.scores(values, out.token_counts, out.truncated)

    async def _rows(
        self,
        query: str,
        documents: Sequence[str],
        truncate: bool,
        *,
        owners: np.ndarray | None,
        budget: int | None = None,
        adapter: str | None = None,
    ) -> list[TokenRow]:
        """The (query, document) pairs tokenized once, off the event loop, each with ``adapter``'s index; with
        truncation off, the first cut pair is refused as ``documents[i]`` (``owners[i]`` for a window)."""
        pairs = [(query, d) for d in documents]
        with tracing.tokenizing(len(pairs)):
            rows = await asyncio.to_thread(partial(self.cross_encoder.tokenize_rows, pairs, adapter=adapter))
        check_budget(rows, budget)
        at = None if truncate else first_cut(rows)
        if at is not None:
            (length,) = await asyncio.to_thread(self.cross_encoder.count_tokens, [query], [documents[at]])
            index = at if owners is None else int(owners[at])
            raise too_long_error(index, self.max_seq_length, param="documents", tokens=length)
        return rows
