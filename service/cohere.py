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
import dataclasses
import uuid
from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

from embedrank.serving.image_text import ImageInput
from embedrank.serving.options import COHERE_FIELDS
from embedrank.serving.pool import ModelPool
from service import api
from service.context import Context
from service.errors import invalid
from service.schemas import INT32_MAX, Adapter, CohereMeta, EmbeddingsRequest, NonEmptyText, Priority, cohere_meta
from service.settings import Images, Limits

CohereType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]


class CohereImageUrl(Struct, kw_only=True):
    url: Annotated[str, Meta(description="The image as a base64 data URL (data:image/png;base64,...)")]


class CohereTextContent(Struct, kw_only=True, tag="text", tag_field="type"):
    text: NonEmptyText


class CohereImageContent(Struct, kw_only=True, tag="image_url", tag_field="type"):
    image_url: CohereImageUrl


class CohereInput(Struct, kw_only=True):
    """One of Cohere v2's ``inputs``: its content parts (one text or one image per input here)."""

    content: Annotated[list[CohereTextContent | CohereImageContent], Meta(min_length=1)]


class CohereEmbedRequest(Struct, kw_only=True):
    """Cohere's embed request (v1 and v2): ``texts``, ``images`` or ``inputs``, with ``input_type``,
    ``embedding_types``, ``truncate``."""

    model: Annotated[str, Meta(description="Model identifier of an embedding model")]
    texts: Annotated[
        Annotated[list[NonEmptyText], Meta(min_length=1)] | None,
        Meta(description="The texts to embed (none empty); one of texts, images, inputs", examples=[["hello"]]),
    ] = None
    images: Annotated[
        Annotated[list[str], Meta(min_length=1)] | None,
        Meta(
            description="Images as base64 data URLs (data:image/png;base64,...), for an image-text model (CLIP, "
            "SigLIP); remote URLs are not fetched"
        ),
    ] = None
    inputs: Annotated[
        Annotated[list[CohereInput], Meta(min_length=1)] | None,
        Meta(
            description="v2: inputs of `content` parts (`text`, or `image_url` with a data URL); each input is one "
            "part here (an image-text model embeds a text or an image, not both as one vector)"
        ),
    ] = None
    input_type: Annotated[
        Literal["search_document", "search_query", "classification", "clustering", "image"] | None,
        Meta(
            description="Selects the model's document or query prompt, if it has one (as /v1/embeddings); `image` "
            "(what Cohere asks with images) selects none"
        ),
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
    adapter: Adapter = None
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


def _items(req: CohereEmbedRequest, limits: Limits, policy: Images) -> list[str | ImageInput] | None:
    """What ``images`` or ``inputs`` hold, as texts and images (None: the request sent ``texts``)."""
    given = [name for name in ("texts", "images", "inputs") if getattr(req, name) is not None]
    if len(given) != 1:
        what = "none of them" if not given else " and ".join(given)
        raise invalid(f"send one of texts, images or inputs; the request has {what}", param=(given or ["texts"])[-1])
    field = given[0]
    count = len(getattr(req, field))
    if count > limits.max_inputs:
        raise invalid(
            f"{field} has {count} items; the limit is max_inputs={limits.max_inputs} per request",
            param=field,
            code="too_many_inputs",
        )
    if req.images is not None:
        items: list[str | ImageInput] = [
            api.image_input(url, "images", f"[{i}]", policy) for i, url in enumerate(req.images)
        ]
        api.check_images(items, limits, "images")
        return items
    if req.inputs is None:
        return None
    items = []
    for i, one in enumerate(req.inputs):
        if len(one.content) != 1:
            raise invalid(
                f"inputs[{i}].content has {len(one.content)} parts; this server embeds one text or one image per "
                "input (a fused text-and-image vector is not supported): send each part as its own input",
                param="inputs",
                code="invalid_value",
            )
        part = one.content[0]
        if isinstance(part, CohereTextContent):
            items.append(api.checked_texts([part.text], limits, "inputs")[0])
        else:
            items.append(api.image_input(part.image_url.url, "inputs", f"[{i}].content[0]", policy))
    api.check_images(items, limits, "inputs")
    return items


def _request(req: CohereEmbedRequest, pool: ModelPool, version: str) -> EmbeddingsRequest:
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
        input=list(req.texts) if req.texts is not None else [],  # else the items carry what is embedded
        dimensions=req.output_dimension,
        input_type=None if req.input_type == "image" else req.input_type,
        truncate=req.truncate != "NONE",
        embedding_types=[t for t in types if t not in ("float", "base64")] or None,  # type: ignore[misc]
        priority=req.priority,
        adapter=req.adapter,
    )


def _given_field(req: CohereEmbedRequest) -> str:
    return "images" if req.images is not None else "inputs"


async def embed(req: CohereEmbedRequest, ctx: Context, *, version: str) -> tuple[CohereEmbedResponse, int]:
    """Cohere's embed (``version`` "1" or "2") over :func:`service.api.embed_vectors`. Returns the body and the
    truncated count."""
    items = _items(req, ctx.limits, ctx.settings.images)
    inner = _request(req, ctx.pool, version)
    side: Literal["left", "right"] = "left" if req.truncate == "START" else "right"
    fields = COHERE_FIELDS if req.texts is not None else dataclasses.replace(COHERE_FIELDS, texts=_given_field(req))
    options = api.embed_options(inner, ctx, truncation_side=side, fields=fields)
    embedded = await api.embed_vectors(
        inner, ctx, options, token_ids=ctx.settings.server.decodes_token_ids, items=items
    )
    out, compact = embedded.output, embedded.compact
    types = req.embedding_types or (["float"] if version == "2" else [])
    body_meta = cohere_meta(version, out.total_tokens, out.truncated_count)
    common: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "texts": list(req.texts) if req.texts is not None else [i for i in items or [] if isinstance(i, str)],
        "meta": body_meta,
    }
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
