"""Hugging Face Text Embeddings Inference's protocol: ``/embed``, ``/rerank`` (TEI's shape), ``/embed_sparse``
(SPLADE models), ``/tokenize`` and ``/info``, as TEI documents them, over the same core calls as the native
routes.

TEI serves one model, so its bodies name none: here an optional ``model`` field picks one, and without it
the first configured model that can serve the route answers (for reranking, the first cross-encoder;
``/info`` describes the first configured model). TEI's defaults
hold: vectors are L2-normalized unless ``normalize`` is false (then they are the model's pooled output before
any normalization), ``truncate`` null or absent truncates as the server does by default, and
``truncation_direction: Left`` keeps a text's end. A TEI rerank scores each text's first window only, as TEI
does (the native ``/v1/rerank`` scores long documents window by window). Errors keep the service's one error
body (OpenAI's), with TEI's status codes for the same conditions.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

import embedrank
from embedrank.serving.options import TEI_FIELDS, EmbedOptions
from embedrank.serving.pool import ModelPool
from service import api
from service.context import Context
from service.errors import invalid
from service.schemas import INT32_MAX, Adapter, EmbeddingsRequest, NonEmptyText, RerankRequest
from service.settings import Settings

Direction = Literal["Left", "Right", "left", "right"]
Inputs = Annotated[
    NonEmptyText | Annotated[list[NonEmptyText], Meta(min_length=1)],
    Meta(description="A text or a non-empty list of texts (token ids are not read on TEI routes: send text)"),
]
ModelField = Annotated[
    str | None,
    Meta(description="embedrank: which served model answers (default: the first configured one that can)"),
]


class TEIEmbedRequest(Struct, kw_only=True):
    """TEI's ``/embed`` (and ``POST /`` with ``inputs``)."""

    inputs: Inputs
    normalize: Annotated[bool, Meta(description="L2-normalize the vectors (default true, as TEI)")] = True
    truncate: Annotated[
        bool | None, Meta(description="Cut texts longer than the model's window (null: the server default, true)")
    ] = None
    truncation_direction: Annotated[Direction, Meta(description="Which end a long text loses: Right (default)")] = (
        "Right"
    )
    prompt_name: Annotated[str | None, Meta(description="One of the model's prompts, put before every text")] = None
    dimensions: Annotated[
        Annotated[int, Meta(ge=1, le=INT32_MAX)] | None,
        Meta(description="Truncate the vectors to this many dimensions (renormalized when normalize is true)"),
    ] = None
    model: ModelField = None
    adapter: Adapter = None


class TEIRerankRequest(Struct, kw_only=True):
    """TEI's ``/rerank`` (``texts``; a body with ``documents`` is Cohere's and goes to the native rerank)."""

    query: Annotated[str, Meta(min_length=1, description="The search query")]
    texts: Annotated[list[NonEmptyText], Meta(min_length=1, description="The texts to score against the query")]
    raw_scores: Annotated[
        bool,
        Meta(
            description="Scores before the model's activation, e.g. logits instead of sigmoid (not for several labels)"
        ),
    ] = False
    return_text: Annotated[bool, Meta(description="Include each text in its result")] = False
    top_n: Annotated[
        Annotated[int, Meta(ge=1, le=INT32_MAX)] | None,
        Meta(description="embedrank (as LiteLLM sends it): return the best top_n only (default: all)"),
    ] = None
    truncate: Annotated[
        bool | None, Meta(description="Cut pairs longer than the model's window (null: the server default, true)")
    ] = None
    truncation_direction: Annotated[Direction, Meta(description="Only Right is supported for pairs")] = "Right"
    model: ModelField = None
    adapter: Adapter = None


class TEIEmbedSparseRequest(Struct, kw_only=True):
    """TEI's ``/embed_sparse``: SPLADE vectors as the non-zero ``(index, value)`` pairs of each input."""

    inputs: Inputs
    truncate: Annotated[
        bool | None, Meta(description="Cut texts longer than the model's window (null: the server default, true)")
    ] = None
    truncation_direction: Annotated[Direction, Meta(description="Only Right is supported for sparse models")] = "Right"
    prompt_name: Annotated[str | None, Meta(description="One of the model's prompts, put before every text")] = None
    model: Annotated[
        str | None,
        Meta(description="embedrank: which served sparse model answers (default: the first configured one)"),
    ] = None
    input_type: Annotated[
        Literal["query", "document"] | None,
        Meta(
            description="embedrank: for an inference-free SPLADE (a query route of weights per token), which route "
            "runs; default: the document route"
        ),
    ] = None
    adapter: Adapter = None


class SparseValue(Struct, kw_only=True):
    index: Annotated[int, Meta(description="The vocabulary entry (token id)")]
    value: Annotated[float, Meta(description="Its weight, > 0")]


class TEITokenizeRequest(Struct, kw_only=True):
    """TEI's ``/tokenize``: every token with its id and character span."""

    inputs: Inputs
    add_special_tokens: Annotated[bool, Meta(description="Include the model's special tokens (default true)")] = True
    prompt_name: Annotated[str | None, Meta(description="One of the model's prompts, put before every text")] = None
    model: ModelField = None


class Rank(Struct, kw_only=True, omit_defaults=True):
    index: int
    score: float
    text: str | UnsetType = UNSET


class SimpleToken(Struct, kw_only=True):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class EmbeddingModelInfo(Struct, kw_only=True):
    pooling: str


class ClassifierInfo(Struct, kw_only=True):
    id2label: dict[str, str]
    label2id: dict[str, int]


class ModelType(Struct, kw_only=True, omit_defaults=True):
    """``{"embedding": {"pooling": ...}}`` or ``{"reranker": {"id2label": ..., "label2id": ...}}``."""

    embedding: EmbeddingModelInfo | UnsetType = UNSET
    reranker: ClassifierInfo | UnsetType = UNSET


class Info(Struct, kw_only=True):
    model_id: str
    model_sha: str | None
    model_dtype: str
    served_model_name: str
    model_type: ModelType
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str


def _model(pool: ModelPool, model: str | None, capability: str) -> str:
    return model if model is not None else pool.default(capability)


async def embed(req: TEIEmbedRequest, ctx: Context) -> tuple[list[list[float]], int]:
    """TEI's ``/embed``: the vectors as a bare array. Returns it and the truncated count."""
    inner = EmbeddingsRequest(
        model=_model(ctx.pool, req.model, "embeddings"),
        input=req.inputs,  # type: ignore[arg-type]  # texts only: a subset of what EmbeddingsRequest takes
        dimensions=req.dimensions,
        prompt_name=req.prompt_name,
        truncate=req.truncate is not False,
        adapter=req.adapter,
    )
    side: Literal["left", "right"] = "left" if req.truncation_direction.lower() == "left" else "right"
    options = api.embed_options(inner, ctx, normalize=req.normalize, truncation_side=side, fields=TEI_FIELDS)
    embedded = await api.embed_vectors(inner, ctx, options, token_ids=False)
    return api.float_json(embedded.output.embeddings), embedded.output.truncated_count


async def rerank(req: TEIRerankRequest, ctx: Context) -> tuple[list[Rank], int]:
    """TEI's ``/rerank``: ``[{index, score, text?}]``, highest score first. Returns it and the truncated count."""
    model = _model(ctx.pool, req.model, "rerank")
    if req.truncation_direction.lower() == "left":
        raise invalid(
            "truncation_direction=Left is not supported for reranking (pairs lose their end); leave it out",
            param="truncation_direction",
        )
    inner = RerankRequest(
        model=model,
        query=req.query,
        documents=list(req.texts),
        top_n=req.top_n,
        truncate=req.truncate is not False,
        max_chunks_per_doc=1,  # TEI scores a text's first window
        adapter=req.adapter,
    )
    body, truncated = await api.rerank(inner, ctx, raw_scores=req.raw_scores)
    ranks = [
        Rank(index=r.index, score=r.relevance_score, text=req.texts[r.index] if req.return_text else UNSET)
        for r in body.results
    ]
    return ranks, truncated


async def embed_sparse(req: TEIEmbedSparseRequest, ctx: Context) -> tuple[list[list[SparseValue]], int]:
    """TEI's ``/embed_sparse``: per input, its non-zero weights by vocabulary index (ascending). Returns them
    and the truncated count."""
    if req.truncation_direction.lower() == "left":
        raise invalid(
            "truncation_direction=Left is not supported for sparse models; leave it out", param="truncation_direction"
        )
    texts = api.checked_texts(req.inputs, ctx.limits, "inputs")
    options = EmbedOptions(
        input_type=req.input_type,
        prompt_name=req.prompt_name,
        truncate=req.truncate is not False,
        budget=ctx.limits.max_request_tokens,
        fields=TEI_FIELDS,
        adapter=req.adapter,
    )
    embedded = await ctx.pool.get(_model(ctx.pool, req.model, "sparse"), "sparse").sparse(texts, options)
    rows = [
        [SparseValue(index=k, value=v) for k, v in zip(indices, values, strict=True)]
        for indices, values in embedded.sparse or ()
    ]
    return rows, embedded.output.truncated_count


async def tokenize(req: TEITokenizeRequest, ctx: Context) -> tuple[list[list[SimpleToken]], None]:
    """TEI's ``/tokenize``: every token of each input, untruncated (nothing is truncated)."""
    texts = api.checked_texts(req.inputs, ctx.limits, "inputs")
    served = ctx.pool.get(_model(ctx.pool, req.model, "embeddings"), "embeddings")
    spans = await served.token_spans(texts, prompt_name=req.prompt_name, add_special_tokens=req.add_special_tokens)
    tokens = [
        [SimpleToken(id=t.id, text=t.text, special=t.special, start=t.start, stop=t.stop) for t in row] for row in spans
    ]
    return tokens, None


def info(pool: ModelPool, settings: Settings) -> Info:
    """TEI's ``/info`` for the model that TEI routes use by default (the first configured one)."""
    model_id, served = next(iter(pool.described().items()))
    spec = served.spec
    declared = served.declared
    if declared.tei_type == "embedding":
        pooling = declared.tei_pooling or (spec.pooling.value if spec.pooling is not None else "mean")
        model_type = ModelType(embedding=EmbeddingModelInfo(pooling=str(pooling)))
    else:
        model_type = ModelType(reranker=ClassifierInfo(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0}))
    precision = {"fp32": "float32", "bf16": "bfloat16", "int8": "int8"}.get(served.precision, served.precision)
    return Info(
        model_id=spec.model_id,
        model_sha=None,
        model_dtype=precision,
        served_model_name=model_id,
        model_type=model_type,
        max_concurrent_requests=settings.engine.max_queue,
        max_input_length=spec.max_seq_length,
        max_batch_tokens=served.batch_bounds[0],
        max_batch_requests=served.batch_bounds[1],
        max_client_batch_size=settings.limits.max_inputs,
        auto_truncate=True,
        tokenization_workers=1,
        version=embedrank.__version__,
    )
