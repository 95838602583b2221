"""Every endpoint that calls the core, as one object: its paths, the schema its body is decoded against, and its
call, ``call(body, context)``, which returns the response body and the number of inputs it truncated (None
where nothing can be). The routes (:mod:`service.routes`), the fast path (:mod:`service.fast_path`) and batch
lines (:mod:`service.batches.lines`) look their endpoint up here; the body each path is decoded against
(:data:`BODIES`) and the urls a batch line may name (:data:`BATCH_URLS`) derive from the table. A new endpoint
is one entry (and a route that serves it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from service import api, cohere, tei
from service.context import Context
from service.decoding import ByField
from service.schemas import EmbeddingsRequest, RerankRequest, TokenizeRequest

Work = Coroutine[Any, Any, tuple[Any, int | None]]


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One endpoint: the ``paths`` that serve it, the ``body`` schema (a msgspec type, or a
    :class:`~service.decoding.ByField` that picks one of two by a field), the core ``call``, and the paths a
    batch line may name as its ``url`` (``batch_paths``, OpenAI's Batch API)."""

    paths: tuple[str, ...]
    body: Any
    call: Callable[[Any, Context], Work]
    batch_paths: tuple[str, ...] = ()


def _rerank_either(body: Any, ctx: Context) -> Work:
    """``/rerank``: TEI's rerank for a body with ``texts``, Cohere's (as vLLM and Infinity serve it) otherwise."""
    return tei.rerank(body, ctx) if isinstance(body, tei.TEIRerankRequest) else api.rerank(body, ctx)


def _tei_root(body: Any, ctx: Context) -> Work:
    """TEI's root route: a body with ``inputs`` embeds, one with ``texts`` reranks."""
    return tei.embed(body, ctx) if isinstance(body, tei.TEIEmbedRequest) else tei.rerank(body, ctx)


EMBEDDINGS = Endpoint(
    ("/v1/embeddings", "/embeddings"), EmbeddingsRequest, api.create_embeddings, batch_paths=("/v1/embeddings",)
)
RERANK = Endpoint(("/v1/rerank", "/v2/rerank"), RerankRequest, api.rerank, batch_paths=("/v1/rerank", "/v2/rerank"))
TOKENIZE = Endpoint(("/v1/tokenize",), TokenizeRequest, api.tokenize)
COHERE_EMBED_V1 = Endpoint(("/v1/embed",), cohere.CohereEmbedRequest, partial(cohere.embed, version="1"))
COHERE_EMBED_V2 = Endpoint(
    ("/v2/embed",), cohere.CohereEmbedRequest, partial(cohere.embed, version="2"), batch_paths=("/v2/embed",)
)
TEI_EMBED = Endpoint(("/embed",), tei.TEIEmbedRequest, tei.embed)
TEI_EMBED_SPARSE = Endpoint(("/embed_sparse",), tei.TEIEmbedSparseRequest, tei.embed_sparse)
TEI_TOKENIZE = Endpoint(("/tokenize",), tei.TEITokenizeRequest, tei.tokenize)
RERANK_EITHER = Endpoint(("/rerank",), ByField("texts", tei.TEIRerankRequest, RerankRequest), _rerank_either)
TEI_ROOT = Endpoint(("/",), ByField("texts", tei.TEIRerankRequest, tei.TEIEmbedRequest), _tei_root)

ENDPOINTS = (
    EMBEDDINGS,
    RERANK,
    TOKENIZE,
    COHERE_EMBED_V1,
    COHERE_EMBED_V2,
    TEI_EMBED,
    TEI_EMBED_SPARSE,
    TEI_TOKENIZE,
    RERANK_EITHER,
    TEI_ROOT,
)
"""The table."""

BY_PATH: dict[str, Endpoint] = {path: endpoint for endpoint in ENDPOINTS for path in endpoint.paths}
"""Each path's endpoint."""

BODIES: dict[str, Any] = {path: endpoint.body for path, endpoint in BY_PATH.items()}
"""The schema each path's body is decoded against (once, strictly, before its handler runs)."""

BATCH: dict[str, Endpoint] = {path: endpoint for endpoint in ENDPOINTS for path in endpoint.batch_paths}
"""The endpoint of each url a batch line may name."""

BATCH_URLS: tuple[str, ...] = tuple(BATCH)
