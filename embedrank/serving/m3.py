"""bge-m3 behind a :class:`~embedrank.serving.engine.BatchEngine`: one forward pass per batch gives every
text's dense vector, lexical weights and multi-vectors (:mod:`embedrank.models.m3`), and texts from many
requests share passes. Embedding requests take the outputs they ask for; rerank requests score a query
against documents with bge-m3's combined score."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from embedrank.errors import InvalidInputError
from embedrank.math.similarity import check_dimensions, l2_normalize, truncate_dims
from embedrank.models.checks import too_long_error
from embedrank.models.m3 import DEFAULT_WEIGHTS, M3Encoder, M3Output, M3Row, gather, query_scores
from embedrank.models.prompts import with_prompt
from embedrank.models.tokens import TokenRow
from embedrank.serving import tracing
from embedrank.serving.inputs import check_budget, first_cut
from embedrank.serving.late import LateInteractionRunner
from embedrank.serving.options import EMBED_DEFAULTS, RERANK_DEFAULTS, EmbedOptions, Refusal, RerankOptions, refuse
from embedrank.types import ModelOutput


class M3Result(ModelOutput):
    """One request's bge-m3 outputs: ``values`` (:attr:`embeddings`) the dense vectors ``(N, D)``,
    :attr:`sparse` the lexical weights ``(N, V)`` (also :attr:`vectors`, as a sparse model's result),
    :attr:`multi` the multi-vectors."""

    def __init__(self, out: M3Output, dense: np.ndarray) -> None:
        super().__init__(dense, out.token_counts, out.truncated)
        self.sparse = out.sparse
        self.multi = out.multi

    @property
    def vectors(self) -> Any:
        return self.sparse


REFUSED = (
    Refusal("chunking", "chunking is not supported for bge-m3 models (they read 8,192 tokens)"),
    Refusal("truncation_side", "bge-m3 models cut over-long texts at the end only", lambda side: side != "right"),
)
"""The embedding options a bge-m3 model refuses."""


class AsyncM3Encoder(LateInteractionRunner):
    """bge-m3's outputs and scores through a :class:`BatchEngine`."""

    kind = "m3"
    scorer = "bge-m3"

    model: M3Encoder

    def run_rows(self, rows: Sequence[TokenRow]) -> list[M3Row]:
        return self.model.outputs_rows(rows)

    async def _outputs(
        self,
        texts: Sequence[str],
        *,
        truncate: bool,
        priority: int,
        param: str,
        budget: int | None,
        multi_budget: int | None = None,
    ) -> M3Output:
        """Tokenize, check the bounds (``budget`` tokens; ``multi_budget`` multi-vectors), then compute.
        ``param`` ``"query"`` names the first text the query and the rest ``documents[i]``."""
        with tracing.tokenizing(len(texts)):
            rows = await asyncio.to_thread(self.model.tokenize_rows, list(texts))
        check_budget(rows, budget)
        vectors = sum(r.length - 1 for r in rows)
        if multi_budget is not None and vectors > multi_budget:
            raise InvalidInputError(
                f"the request's multi-vectors would be {vectors} token vectors; the limit is {multi_budget} per "
                "request (EMBEDRANK_MAX_MULTIVECTOR_TOKENS): send fewer or shorter texts",
                param="embedding_types",
            )
        at = None if truncate else first_cut(rows)
        if at is not None:
            if param == "query":
                raise (
                    too_long_error(0, self.max_seq_length, param="query")
                    if at == 0
                    else too_long_error(at - 1, self.max_seq_length, param="documents")
                )
            raise too_long_error(at, self.max_seq_length, param=param)
        m3_rows, out = await self.submit_rows(rows, priority)
        return gather(m3_rows, list(out.token_counts), list(out.truncated), self.model.vocab_size, normalize=False)

    async def embed(
        self, texts: Sequence[str], options: EmbedOptions = EMBED_DEFAULTS, *, prompt: str = ""
    ) -> M3Result:
        """The outputs of ``prompt + text`` for each text; the dense vectors normalized (unless ``normalize``
        is False) and cut to ``dimensions``; ``multi_budget`` bounds the token vectors when ``multivector`` is
        among the types asked for. :data:`REFUSED`: bge-m3 reads 8,192 tokens at once."""
        refuse(options, *REFUSED)
        check_dimensions(options.dimensions, self.dimension, options.fields.dimensions)
        out = await self._outputs(
            with_prompt(texts, prompt),
            truncate=options.truncate,
            priority=options.priority,
            param=options.fields.texts,
            budget=options.budget,
            multi_budget=options.multi_budget if "multivector" in options.types else None,
        )
        do_norm = options.normalize is not False
        dense = l2_normalize(out.dense) if do_norm else out.dense
        return M3Result(out, truncate_dims(dense.astype(np.float32), options.dimensions, renormalize=do_norm))

    async def quantization_ranges(self, dimensions: int | None = None) -> np.ndarray:
        return await asyncio.to_thread(partial(self.encoder.quantization_ranges, dimensions))

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        options: RerankOptions = RERANK_DEFAULTS,
        *,
        weights: Sequence[float] = DEFAULT_WEIGHTS,
    ) -> ModelOutput:
        """bge-m3's combined score (dense, lexical, MaxSim with ``weights``) of ``query`` against each
        document, one job for all texts; token counts cover the query (first) and every document. Documents
        are read whole up to the model's window (8,192 tokens for bge-m3), and cut there: ``chunking`` that
        asks for windows (an overlap or a number of chunks) is refused. The combined score has no activation, so
        ``raw_scores`` gives the same scores."""
        chunking = options.chunking
        if chunking is not None and (chunking.overlap is not None or chunking.max_chunks is not None):
            raise InvalidInputError(
                "bge-m3 models read each document whole up to their window; chunk_overlap and max_chunks_per_doc "
                "do not apply",
                param="chunk_overlap" if chunking.overlap is not None else "max_chunks_per_doc",
            )
        texts = [query, *documents]
        out = await self._outputs(
            texts, truncate=options.truncate, priority=options.priority, param="query", budget=options.budget
        )
        scores = query_scores(dataclasses.replace(out, dense=l2_normalize(out.dense)), weights)["combined"]
        return ModelOutput(scores, out.token_counts, out.truncated)
