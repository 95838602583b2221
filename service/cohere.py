"""Cohere's embed API (``/v1/embed``, ``/v2/embed``): its request and response shapes over the same core call
as ``/v1/embeddings``. Cohere's rerank (``/v1/rerank``, ``/v2/rerank``) is the native rerank route.

A Cohere request becomes an :class:`~service.schemas.EmbeddingsRequest` (``texts`` -> ``input``,
``output_dimension`` -> ``dimensions``, ``truncate`` ``END``/``START``/``NONE`` -> cut the end, cut the start,
refuse), goes through :func:`service.api.create_embeddings`, and the vectors come back in Cohere's shape:
v1 without ``embedding_types`` as a list of float vectors (``embeddings_floats``), otherwise, and always in
v2, as an object keyed by type (``embeddings_by_type``); ``meta`` carries the billed input tokens and a
warning when inputs were truncated.
"""

from __future__ import annotations

import base64
import uuid
from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

from embedrank.serving.options import COHERE_FIELDS
from embedrank.serving.pool import ModelPool
from service import api
from service.context import Context
from service.errors import invalid
from service.schemas import INT32_MAX, CohereMeta, EmbeddingsRequest, NonEmptyText, Priority, cohere_meta

CohereType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]


class CohereEmbedRequest(Struct, kw_only=True):
    """Cohere's embed request (v1 and v2): ``texts`` with ``input_type``, ``embedding_types``, ``truncate``."""

    model: Annotated[str, Meta(description="Model identifier of an embedding model")]
    texts: Annotated[
        list[NonEmptyText], Meta(min_length=1, description="The texts to embed (none empty)", examples=[["hello"]])
    ]
    input_type: Annotated[
        Literal["search_document", "search_query", "classification", "clustering"] | None,
        Meta(description="Selects the model's document or query prompt, if it has one (as /v1/embeddings)"),
    ] = None
    embedding_types: Annotated[
        Annotated[list[CohereType], Meta(min_length=1, max_length=16)] | None,
        Meta(
            description="Types to return (v1 default: a list of float vectors; v2 default: float). "
            "base64: little-endian float32 bytes"
        ),
    ] = None
    truncate: Annotated[
        Literal["NONE", "START", "END"],
        Meta(description="Text longer than the model's window: END cuts its end (default), START its start, NONE: 400"),
    ] = "END"
    output_dimension: Annotated[
        Annotated[int, Meta(ge=1, le=INT32_MAX)] | None,
        Meta(description="v2: truncate the vectors to this many dimensions, renormalized"),
    ] = None
    max_tokens: Annotated[
        Annotated[int, Meta(ge=1, le=INT32_MAX)] | None,
        Meta(description="v2: at most this many tokens per text; only the model's window or more is supported"),
    ] = None
    images: Annotated[list[str] | None, Meta(description="Not supported (text models only)")] = None
    inputs: Annotated[list[Any] | None, Meta(description="Not supported (send texts)")] = None
    priority: Priority = 0


class CohereEmbeddingsByType(Struct, kw_only=True, omit_defaults=True, rename={"float_": "float"}):
    float_: list[list[float]] | UnsetType = UNSET
    int8: list[list[int]] | UnsetType = UNSET
    uint8: list[list[int]] | UnsetType = UNSET
    binary: list[list[int]] | UnsetType = UNSET
    ubinary: list[list[int]] | UnsetType = UNSET
    base64: list[str] | UnsetType = UNSET


class CohereEmbedResponse(Struct, kw_only=True):
    id: str
    response_type: Literal["embeddings_floats", "embeddings_by_type"]
    embeddings: Annotated[
        list[list[float]] | CohereEmbeddingsByType,
        Meta(description="embeddings_floats: one float vector per text; embeddings_by_type: vectors per type"),
    ]
    texts: list[str]
    meta: CohereMeta


def _request(req: CohereEmbedRequest, pool: ModelPool, version: str) -> EmbeddingsRequest:
    if req.images is not None or req.inputs is not None:
        field = "images" if req.images is not None else "inputs"
        raise invalid(f"{field} is not supported: this server embeds text; send texts", param=field)
    if req.max_tokens is not None:
        window = pool.get(req.model, "embeddings").spec.max_seq_length
        if req.max_tokens < window:
            raise invalid(
                f"max_tokens={req.max_tokens} is below the model's window of {window} tokens; only texts cut at "
                f"the window are supported (leave max_tokens out)",
                param="max_tokens",
            )
    types = req.embedding_types or (["float"] if version == "2" else [])
    return EmbeddingsRequest(
        model=req.model,
        input=list(req.texts),
        dimensions=req.output_dimension,
        input_type=req.input_type,
        truncate=req.truncate != "NONE",
        embedding_types=[t for t in types if t not in ("float", "base64")] or None,  # type: ignore[misc]
        priority=req.priority,
    )


async def embed(req: CohereEmbedRequest, ctx: Context, *, version: str) -> tuple[CohereEmbedResponse, int]:
    """Cohere's embed (``version`` "1" or "2") over :func:`service.api.embed_vectors`. Returns the body and the
    truncated count."""
    inner = _request(req, ctx.pool, version)
    side: Literal["left", "right"] = "left" if req.truncate == "START" else "right"
    options = api.embed_options(inner, ctx, truncation_side=side, fields=COHERE_FIELDS)
    embedded = await api.embed_vectors(inner, ctx, options, token_ids=ctx.settings.server.decodes_token_ids)
    out, compact = embedded.output, embedded.compact
    types = req.embedding_types or (["float"] if version == "2" else [])
    body_meta = cohere_meta(version, out.total_tokens, out.truncated_count)
    common: dict[str, Any] = {"id": str(uuid.uuid4()), "texts": list(req.texts), "meta": body_meta}
    if not types:
        return CohereEmbedResponse(
            response_type="embeddings_floats", embeddings=api.float_json(out.embeddings), **common
        ), out.truncated_count
    by_type: dict[str, Any] = {}
    for name in dict.fromkeys(types):
        if name == "float":
            by_type["float_"] = api.float_json(out.embeddings)
        elif name == "base64":
            by_type["base64"] = [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in out.embeddings]
        else:
            by_type[name] = compact[name].tolist()
    embeddings = CohereEmbeddingsByType(**by_type)
    return CohereEmbedResponse(response_type="embeddings_by_type", embeddings=embeddings, **common), out.truncated_count
