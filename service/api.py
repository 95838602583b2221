"""The adapter: check a parsed request against the limits, call the core, shape the response."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import msgspec
import numpy as np
import orjson
from msgspec import UNSET, UnsetType

from embedrank.errors import InvalidInputError, shorten
from embedrank.serving.hosting import Embedded
from embedrank.serving.image_text import ImageInput, ImageLimits, is_data_url, is_remote_url
from embedrank.serving.options import EmbedOptions, RerankOptions
from embedrank.serving.pool import ModelPool
from embedrank.types import Chunking
from service.context import Context
from service.errors import invalid
from service.image_urls import fetched, host_allowed
from service.schemas import (
    CompactEmbeddings,
    Embedding,
    EmbeddingList,
    EmbeddingsRequest,
    EmbeddingUsage,
    ModelCard,
    ModelList,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    SparseVector,
    TokenCount,
    TokenizeRequest,
    TokenizeResponse,
    blank,
    cohere_meta,
)
from service.settings import Images, Limits
from service.token_ids import decode_inputs


def _check_texts(texts: list[str], param: str, limits: Limits) -> None:
    for i, text in enumerate(texts):
        if len(text) > limits.max_text_chars:
            raise invalid(
                f"{param}[{i}] has {len(text)} characters; the limit is max_text_chars={limits.max_text_chars}",
                param=param,
                code="text_too_long",
            )


# whitespace as JSON Schema's regular expressions (ECMA-262 \s) define it, so that the schema's "query: \S"
# and the server agree (Python's str.strip() also strips U+0085 and other separators that \S matches)
_FIELDS = {"overlap": "chunk_overlap"}  # the core's argument names that differ from the request's fields


@contextlib.contextmanager
def _request_fields() -> Iterator[None]:
    """A core error that names an argument names the request field instead (``overlap`` -> ``chunk_overlap``)."""
    try:
        yield
    except InvalidInputError as exc:
        field = _FIELDS.get(exc.param or "")
        if field is None:
            raise
        raise invalid(str(exc).replace(f"{exc.param}=", f"{field}="), param=field, code=f"{field}_too_large") from None


def _checked_inputs(value: str | list[Any], limits: Limits, param: str = "input") -> list[str | list[int]]:
    """``value`` (the request's field ``param``) as a list of texts and token-id arrays, within the limits (the decoder already refused empty
    texts and lists). A flat array of integers is one token-id array."""
    items: list[Any] = [value] if isinstance(value, str) else value
    bare = [isinstance(item, int) for item in items]
    if all(bare):
        items = [items]
    elif any(bare):
        raise invalid(
            f"{param} mixes token ids with texts or token-id arrays; send a string, an array of strings, "
            "an array of token ids, or an array of token-id arrays",
            param=param,
            code="invalid_type",
        )
    if len(items) > limits.max_inputs:
        raise invalid(
            f"{param} has {len(items)} items; the limit is max_inputs={limits.max_inputs} per request",
            param=param,
            code="too_many_inputs",
        )
    for i, item in enumerate(items):
        if not isinstance(item, str) and len(item) > limits.max_text_chars:
            raise invalid(
                f"{param}[{i}] has {len(item)} token ids; the limit is max_text_chars={limits.max_text_chars}",
                param=param,
                code="text_too_long",
            )
    return items


def checked_texts(value: str | list[str], limits: Limits, param: str = "input") -> list[str]:
    """``value`` (texts only) as a list within the limits."""
    texts: list[str] = _checked_inputs(value, limits, param)  # type: ignore[assignment]
    _check_texts(texts, param, limits)
    return texts


async def _input_texts(value: str | list[Any], limits: Limits, token_ids: bool, param: str = "input") -> list[str]:
    """``value`` (the request's field ``param``) as texts: token-id arrays decoded with cl100k_base
    (:mod:`service.token_ids`), off the loop."""
    items = _checked_inputs(value, limits, param)
    if all(isinstance(item, str) for item in items):
        texts: list[str] = items  # type: ignore[assignment]
    else:
        texts = await asyncio.to_thread(decode_inputs, items, token_ids)
    _check_texts(texts, param, limits)
    return texts


def image_input(value: str, field: str, at: str, policy: Images) -> ImageInput:
    """An input that is to be an image, the request's ``field`` holding it ``at`` a place (``[2]``): a base64
    ``data:`` URL, or an ``http(s)`` URL of a host the policy allows (fetched before the core is called,
    :mod:`service.image_urls`). Any other remote URL is refused: the server does not fetch what a request points
    to (server-side request forgery)."""
    image = ImageInput(value, field, at)
    if is_remote_url(value):
        host = urlsplit(value).hostname or ""
        if not host_allowed(host, policy.image_url_hosts):
            raise invalid(
                f"{image.name} is a remote URL of a host this server does not fetch images from ({host or 'none'}): "
                "send the image as a base64 data URL (data:image/png;base64,...)",
                param=field,
                code="image_url_not_allowed",
            )
        return image
    if not is_data_url(value):
        raise invalid(
            f"{image.name} is not an image: send a base64 data URL (data:image/png;base64,...)",
            param=field,
            code="invalid_image",
        )
    return image


def check_images(items: Sequence[str | ImageInput], limits: Limits, param: str) -> None:
    """At most ``max_images`` images in one request."""
    count = sum(isinstance(item, ImageInput) for item in items)
    if count > limits.max_images:
        raise invalid(
            f"{param} holds {count} images; the limit is max_images={limits.max_images} per request",
            param=param,
            code="too_many_images",
        )


async def _input_items(
    value: str | list[Any], limits: Limits, token_ids: bool, param: str, modality: str | None, policy: Images
) -> list[str | ImageInput]:
    """``value`` as texts and images: with ``modality`` ``image`` every input is an image, with ``text`` none
    is, and without it an input that is a ``data:image/`` URL is one. Texts are checked and decoded as
    :func:`_input_texts` does; images only counted here (the core reads them within the image limits)."""
    if modality == "text":
        return list(await _input_texts(value, limits, token_ids, param))
    items = _checked_inputs(value, limits, param)
    pictures = [isinstance(item, str) and (modality == "image" or item[:11].lower() == "data:image/") for item in items]
    if not any(pictures):
        return list(await _input_texts(value, limits, token_ids, param))
    if modality == "image" and not all(isinstance(item, str) for item in items):
        raise invalid(f"{param} holds token ids; with modality image send data URLs", param=param, code="invalid_type")
    texts = [item for item, picture in zip(items, pictures, strict=True) if not picture]
    decoded = iter(await _input_texts(texts, limits, token_ids, param) if texts else [])
    out: list[str | ImageInput] = [
        image_input(item, param, f"[{i}]", policy) if picture else next(decoded)  # type: ignore[arg-type]
        for i, (item, picture) in enumerate(zip(items, pictures, strict=True))
    ]
    check_images(out, limits, param)
    return out


def float_json(values: np.ndarray) -> Any:
    """A float array (a vector or a matrix) as JSON numbers at float32 precision: the shortest decimal that
    reads back to the same float32 (at most 9 significant digits, as OpenAI returns them), not the 17 digits
    of the float64 it would be widened to; about 40% fewer bytes, formatted in one call (orjson), then placed
    into the response as it is (``msgspec.Raw``)."""
    return msgspec.Raw(orjson.dumps(np.ascontiguousarray(values, dtype=np.float32), option=orjson.OPT_SERIALIZE_NUMPY))


def _encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """A float32 vector as numbers (:func:`float_json`) or base64 of little-endian float32; an int8/uint8 one
    as integers or base64 of its bytes."""
    if encoding_format == "base64":
        raw = vector.astype("<f4", copy=False) if np.issubdtype(vector.dtype, np.floating) else vector
        return base64.b64encode(raw.tobytes()).decode("ascii")
    return float_json(vector) if np.issubdtype(vector.dtype, np.floating) else vector.tolist()  # type: ignore[no-any-return]


def embed_options(req: EmbeddingsRequest, ctx: Context, **given: Any) -> EmbedOptions:
    """Every option of ``req`` as the core's :class:`~embedrank.serving.options.EmbedOptions`, within the
    context's limits and with its use of the vector cache; ``given`` sets the options another protocol's
    request words differently (``normalize``, ``truncation_side``, ``fields``)."""
    return EmbedOptions(
        input_type=req.input_type,
        prompt_name=req.prompt_name,
        task=req.task,
        adapter=req.adapter,
        types=tuple(req.embedding_types or ()),
        dimensions=req.dimensions,
        truncate=req.truncate,
        priority=req.priority,
        chunking=Chunking(overlap=req.chunk_overlap) if req.chunking else None,
        budget=ctx.limits.max_request_tokens,
        multi_budget=ctx.limits.max_multivector_tokens,
        cached=ctx.cached,
        image_limits=ImageLimits(max_bytes=ctx.limits.max_image_bytes, max_pixels=ctx.limits.max_image_pixels),
        **given,
    )


async def embed_vectors(
    req: EmbeddingsRequest,
    ctx: Context,
    options: EmbedOptions,
    *,
    token_ids: bool,
    items: list[str | ImageInput] | None = None,
) -> Embedded:
    """The core call behind every embedding route: the vectors ``(N, D)`` and each of the types ``options``
    asks for, for the texts and images of ``req.input`` (token-id arrays decoded when ``token_ids``), or for
    ``items`` a protocol has already read from its own fields."""
    if items is None:
        policy = ctx.settings.images
        items = await _input_items(req.input, ctx.limits, token_ids, options.fields.texts, req.modality, policy)
    if not all(isinstance(item, str) for item in items):  # images named by URL are fetched first
        items = await fetched(items, ctx.settings.images, ctx.limits)
    with _request_fields():
        return await ctx.pool.get(req.model, "embeddings").embed(items, options, name=shorten(req.model))


async def create_embeddings(req: EmbeddingsRequest, ctx: Context) -> tuple[EmbeddingList, int]:
    """Embeddings. Returns the body and the number of inputs that were truncated."""
    options = embed_options(req, ctx)
    embedded = await embed_vectors(req, ctx, options, token_ids=ctx.settings.server.decodes_token_ids)
    out, compact = embedded.output, embedded.compact
    fmt = req.encoding_format
    types = set(req.embedding_types or [])

    def others(i: int) -> CompactEmbeddings | UnsetType:
        fields: dict[str, Any] = {t: _encode_vector(c[i], fmt) for t, c in compact.items()}
        if embedded.sparse is not None:  # SPLADE or bge-m3 lexical weights, token vectors (the core checked the model)
            indices, values = embedded.sparse[i]
            fields["sparse"] = SparseVector(indices=indices, values=values)
        if "multivector" in types:
            fields["multivector"] = [_encode_vector(v, fmt) for v in out.multi[i]]  # type: ignore[attr-defined]
        return CompactEmbeddings(**fields) if fields else UNSET

    data = [
        Embedding(index=i, embedding=_encode_vector(v, fmt), embeddings=others(i)) for i, v in enumerate(out.embeddings)
    ]
    usage = EmbeddingUsage(
        prompt_tokens=out.total_tokens,
        total_tokens=out.total_tokens,
        chunked_inputs=out.chunked if req.chunking else UNSET,
    )
    return EmbeddingList(data=data, model=req.model, usage=usage), out.truncated_count


async def tokenize(req: TokenizeRequest, ctx: Context) -> tuple[TokenizeResponse, None]:
    """Token counts of each input as ``/v1/embeddings`` would process it (same prompt selection); nothing is
    truncated."""
    texts = await _input_texts(req.input, ctx.limits, token_ids=False)
    served = ctx.pool.get(req.model, "embeddings")
    counts, tokens = await served.count(
        texts,
        input_type=req.input_type,
        prompt_name=req.prompt_name,
        task=req.task,
        adapter=req.adapter,
        return_tokens=req.return_tokens,
    )
    limit = served.spec.max_seq_length
    data = [
        TokenCount(
            index=i,
            count=min(n, limit),
            untruncated_count=n,
            truncated=n > limit,
            tokens=tokens[i] if tokens is not None else UNSET,
        )
        for i, n in enumerate(counts)
    ]
    return TokenizeResponse(model=req.model, max_tokens=limit, data=data), None


async def rerank(req: RerankRequest, ctx: Context, *, raw_scores: bool = False) -> tuple[RerankResponse, int]:
    """Rerank. Returns the body and the number of inputs (query included for a bi-encoder) that were truncated."""
    limits = ctx.limits
    # the decoder has refused an empty query, an empty documents list and top_n < 1 (service.decoding)
    if blank(req.query):
        raise invalid("query is empty or only whitespace", param="query", code="empty_query")
    if len(req.documents) > limits.max_documents:
        raise invalid(
            f"documents has {len(req.documents)} items; the limit is max_documents={limits.max_documents}",
            param="documents",
            code="too_many_documents",
        )
    texts = [d if isinstance(d, str) else d.text for d in req.documents]
    _check_texts([req.query], "query", limits)
    _check_texts(texts, "documents", limits)
    chunking = Chunking(
        overlap=req.chunk_overlap,
        aggregate=req.chunk_aggregation,
        max_chunks=req.max_chunks_per_doc,
        max_tokens=req.max_tokens_per_doc,
    )
    with _request_fields():
        options = RerankOptions(
            truncate=req.truncate,
            chunking=chunking,
            raw_scores=raw_scores,
            priority=req.priority,
            budget=limits.max_request_tokens,
            top_n=req.top_n,
            adapter=req.adapter,
        )
        reranked = await ctx.pool.get(req.model, "rerank").rerank(req.query, texts, options)
    out = reranked.output
    results = [
        RerankResult(
            index=r.index,
            relevance_score=r.score,
            document=RerankDocument(text=texts[r.index]) if req.return_documents else UNSET,
        )
        for r in reranked.ranking
    ]
    body = RerankResponse(
        id=f"rerank-{uuid.uuid4().hex}",
        results=results,
        model=req.model,
        usage=RerankUsage(total_tokens=out.total_tokens, chunked_documents=out.chunked),
        meta=cohere_meta("2", out.total_tokens, out.truncated_count),
    )
    return body, out.truncated_count


def list_models(pool: ModelPool) -> ModelList:
    return ModelList(
        data=[
            ModelCard(
                id=model_id,
                created=served.created,
                capabilities=served.capabilities,  # type: ignore[arg-type]
                outputs=served.outputs,  # type: ignore[arg-type]
                scorer=served.scorer,  # type: ignore[arg-type]
                inputs=list(served.declared.inputs),  # type: ignore[arg-type]
                dimension=getattr(served, "dimension", None) or served.spec.dimension,
                max_tokens=served.spec.max_seq_length,
                aliases=list(served.aliases),
                prompts=dict(served.spec.prompts),
                adapters=list(getattr(served, "adapter_names", ())),  # known once served
                backend=served.backend,
                precision=served.precision,
                inference_precision=getattr(served, "inference_precision", None),  # known once served
                fallback_reason=getattr(served, "fallback_reason", None),
                auto_choice=getattr(served, "auto_choice", None),
            )
            for model_id, served in pool.described().items()
        ]
    )
