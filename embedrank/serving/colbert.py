"""A ColBERT model behind a :class:`~embedrank.serving.engine.BatchEngine`: queries and documents of many
requests share forward passes (:mod:`embedrank.models.colbert`). Embedding requests get each text's token
vectors; rerank requests score the query against each document (or each window of it) by MaxSim."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial

import numpy as np

from embedrank.errors import InvalidInputError
from embedrank.math.late import maxsim_scores
from embedrank.math.similarity import l2_normalize
from embedrank.models.checks import too_long_error
from embedrank.models.colbert import ColBERTEncoder
from embedrank.models.tokens import TokenRow
from embedrank.serving import tracing
from embedrank.serving.inputs import check_budget, field_of, first_cut, plan_chunks
from embedrank.serving.late import LateInteractionRunner
from embedrank.serving.options import EMBED_DEFAULTS, RERANK_DEFAULTS, EmbedOptions, Refusal, RerankOptions, refuse
from embedrank.types import ModelOutput


class MultiVectorResult(ModelOutput):
    """One request's token vectors (:attr:`multi`, ``(T_i, D)`` each); ``values`` (:attr:`embeddings`) holds
    each text's mean token vector, normalized ``(N, D)``: a summary for the ``embedding`` field, not a vector
    the model was trained to compare."""

    def __init__(self, multi: list[np.ndarray], token_counts: list[int], truncated: list[bool]) -> None:
        means = np.stack([m.mean(axis=0) if len(m) else np.zeros(m.shape[1], np.float32) for m in multi])
        super().__init__(l2_normalize(means.astype(np.float32)), token_counts, truncated)
        self.multi = multi


REFUSED = (
    Refusal("chunking", "ColBERT models return a document's token vectors up to its window"),
    Refusal("truncation_side", "ColBERT models cut over-long texts at the end only", lambda side: side != "right"),
    Refusal("dimensions", "ColBERT token vectors keep the model's width"),
    Refusal("normalize", "ColBERT token vectors are always L2-normalized, as MaxSim needs", lambda n: n is False),
)
"""The embedding options a ColBERT model refuses."""


class AsyncColBERTEncoder(LateInteractionRunner):
    """A ColBERT model's token vectors and MaxSim scores through a :class:`BatchEngine`."""

    model: ColBERTEncoder

    def run_rows(self, rows: Sequence[TokenRow]) -> list[np.ndarray]:
        return self.model.vectors_rows(rows)

    async def count(
        self, texts: Sequence[str], *, prompt: str = "", return_tokens: bool = False
    ) -> tuple[list[int], list[list[str]] | None]:
        """Untruncated token counts of each text as a document (its marker included), and on request the
        tokens the model sees as a document (marker inserted, cut at the document length)."""
        marker = int(self.model.prefix_ids[False] is not None)
        counts = await asyncio.to_thread(partial(self.encoder.count_tokens, list(texts), prompt=""))
        tokens = None
        if return_tokens:
            rows = await asyncio.to_thread(partial(self.model.tokenize_rows, list(texts), query=False))
            tokens = [self.encoder.tokenizer.convert_ids_to_tokens(r.tokens["input_ids"]) for r in rows]
        return [n + marker for n in counts], tokens

    async def _rows(
        self,
        texts: Sequence[str],
        *,
        query: bool,
        fields: Sequence[tuple[str, int]] = (),
        budget: int | None = None,
        multi_budget: int | None = None,
    ) -> list[TokenRow]:
        """Tokenize off the event loop and check the bounds: ``budget`` tokens, ``multi_budget`` token vectors;
        with ``fields`` (truncation off), the first cut text is refused, named by request field."""
        with tracing.tokenizing(len(texts)):
            rows = await asyncio.to_thread(partial(self.model.tokenize_rows, list(texts), query=query))
        check_budget(rows, budget)
        vectors = sum(int(r.tokens["keep"].sum()) for r in rows)
        if multi_budget is not None and vectors > multi_budget:
            raise InvalidInputError(
                f"the request's multi-vectors would be {vectors} token vectors; the limit is {multi_budget} per "
                "request (EMBEDRANK_MAX_MULTIVECTOR_TOKENS): send fewer or shorter texts",
                param="embedding_types",
            )
        at = first_cut(rows, sum(size for _, size in fields)) if fields else None
        if at is not None:
            name, index = field_of(at, fields)
            limit = self.model.settings.query_length if query else self.model.settings.document_length
            raise too_long_error(index, limit, param=name)
        return rows

    async def embed(
        self,
        texts: Sequence[str],
        options: EmbedOptions = EMBED_DEFAULTS,
        *,
        prompt: str = "",
        query: bool = False,
    ) -> MultiVectorResult:
        """Token vectors of each text as a query (``query``: marker, expansion to the query length) or a document
        (marker, skiplist). :data:`REFUSED` and prompts do not apply; ``multi_budget`` bounds the token vectors."""
        refuse(options, *REFUSED)
        if prompt:
            raise InvalidInputError(
                "ColBERT models mark queries and documents with their own tokens, not prompts",
                param=options.fields.input_type,
            )
        fields = () if options.truncate else [(options.fields.texts, len(texts))]
        rows = await self._rows(
            texts, query=query, fields=fields, budget=options.budget, multi_budget=options.multi_budget
        )
        vectors, out = await self.submit_rows(rows, options.priority)
        return MultiVectorResult(vectors, list(out.token_counts), list(out.truncated))

    async def rerank(
        self, query: str, documents: Sequence[str], options: RerankOptions = RERANK_DEFAULTS
    ) -> ModelOutput:
        """MaxSim of ``query`` against each document, one job for all texts; token counts cover the query
        (first) and every document (window). With ``chunking``, documents are split into windows of the
        document length and each gets the aggregate of its windows' scores. MaxSim has no activation, so
        ``raw_scores`` gives the same scores."""
        truncate, priority, chunking, budget = options.truncate, options.priority, options.chunking, options.budget
        plan = None
        if chunking is not None:
            plan = await plan_chunks(
                documents, self.encoder.token_offsets, self.model.chunk_window, chunking, truncate, budget=budget
            )
        docs = list(documents if plan is None else plan.texts)
        asked = await self._rows([query], query=True, fields=() if truncate else [("query", 1)], budget=budget)
        fields = () if truncate or plan is not None else [("documents", len(docs))]
        rows = await self._rows(
            docs, query=False, fields=fields, budget=None if budget is None else budget - asked[0].length
        )
        vectors, out = await self.submit_rows(asked + rows, priority)
        scores = maxsim_scores(vectors[0], vectors[1:], reduce="sum")
        if plan is None:
            return ModelOutput(scores, out.token_counts, out.truncated)
        return plan.scores(scores, out.token_counts, out.truncated[1:], leading_flags=out.truncated[:1])
