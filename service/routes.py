"""Every route, in one table: the native OpenAI/Cohere-style routes, Cohere's embed, TEI's protocol, and the
bare aliases vLLM and Infinity serve. Each handler decodes nothing itself (bodies are decoded once, strictly,
before it runs), calls one adapter function, and shapes nothing but the response.
"""

from __future__ import annotations

from typing import Annotated, Any, get_args, get_type_hints

from litestar import Request, Response, get, head, post
from litestar.datastructures import State
from litestar.openapi import ResponseSpec
from litestar.openapi.spec import Example
from litestar.params import Body

from embedrank.serving.pool import ModelPool
from service import api, cohere, endpoints, tei
from service.batches import routes as batch_routes
from service.endpoints import (
    BY_PATH,
    COHERE_EMBED_V1,
    COHERE_EMBED_V2,
    EMBEDDINGS,
    RERANK,
    RERANK_EITHER,
    TEI_EMBED,
    TEI_EMBED_SPARSE,
    TEI_ROOT,
    TEI_TOKENIZE,
    TOKENIZE,
    Endpoint,
)
from service.errors import matches_route
from service.files import routes as file_routes
from service.handling import ERRORS, respond, service_of
from service.litestar_internals import decoded_body
from service.schemas import (
    EMBEDDINGS_EXAMPLE_REQUEST,
    EMBEDDINGS_EXAMPLE_RESPONSE,
    RERANK_EXAMPLE_REQUEST,
    RERANK_EXAMPLE_RESPONSE,
    EmbeddingList,
    EmbeddingsRequest,
    Health,
    ModelList,
    RerankRequest,
    RerankResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from service.vector_stores import routes as vector_store_routes


async def _answer(endpoint: Endpoint, data: Any, request: Request[Any, Any, Any], state: State) -> Response[Any]:
    """The response of ``endpoint``'s call on the decoded body, with the service's context."""
    return await respond(request, endpoint.call(data, service_of(state).ready_context()))


@post(
    list(EMBEDDINGS.paths),
    summary="Create embeddings",
    description="One vector per input, in input order, as OpenAI's embeddings API returns them; optional Cohere-style "
    "embedding_types, prompts and chunking. Response header X-Truncated-Inputs counts inputs cut at max tokens.",
    responses={200: ResponseSpec(EmbeddingList, examples=[Example(value=EMBEDDINGS_EXAMPLE_RESPONSE)]), **ERRORS},
    status_code=200,
)
async def embeddings(
    data: Annotated[EmbeddingsRequest, Body(examples=[Example(summary="Two texts", value=EMBEDDINGS_EXAMPLE_REQUEST)])],
    request: Request[Any, Any, Any],
    state: State,
) -> Response[EmbeddingList]:
    return await _answer(EMBEDDINGS, data, request, state)


@post(
    list(RERANK.paths),
    summary="Rerank documents",
    description="Each document scored against the query, as Cohere's (v1 and v2) and Jina's rerank APIs do; results "
    "sorted by relevance_score, highest first, ties by index. Long documents are scored in windows by default.",
    responses={200: ResponseSpec(RerankResponse, examples=[Example(value=RERANK_EXAMPLE_RESPONSE)]), **ERRORS},
    status_code=200,
)
async def rerank(
    data: Annotated[
        RerankRequest, Body(examples=[Example(summary="Query and two documents", value=RERANK_EXAMPLE_REQUEST)])
    ],
    request: Request[Any, Any, Any],
    state: State,
) -> Response[RerankResponse]:
    return await _answer(RERANK, data, request, state)


@post(
    list(TOKENIZE.paths),
    summary="Count tokens",
    description="Token counts of each input as /v1/embeddings would process it (same prompt selection); "
    "the tokens themselves with return_tokens. As TEI's and vLLM's tokenize.",
    responses={200: ResponseSpec(TokenizeResponse), **ERRORS},
    status_code=200,
)
async def tokenize(
    data: Annotated[
        TokenizeRequest,
        Body(
            examples=[
                Example(
                    summary="Two texts",
                    value={"model": "sentence-transformers/all-MiniLM-L6-v2", "input": ["first text", "second"]},
                )
            ]
        ),
    ],
    request: Request[Any, Any, Any],
    state: State,
) -> Response[TokenizeResponse]:
    return await _answer(TOKENIZE, data, request, state)


@get("/v1/models", summary="List loaded models", responses={401: ERRORS[401], 503: ERRORS[503]})
async def models_route(pool: ModelPool) -> ModelList:
    return api.list_models(pool)


@get(
    "/health",
    summary="Readiness (no key needed)",
    responses={503: ResponseSpec(Health, description="Loading, draining or failed")},
)
async def health(state: State) -> Response[Health]:
    status, detail = service_of(state).readiness()
    return Response(Health(status=status, detail=detail), status_code=200 if status == "ok" else 503)  # type: ignore[arg-type]


@head(
    "/health",
    summary="Readiness, status code only (no key needed)",
    responses={503: ResponseSpec(None, description="Loading, draining or failed")},
)
async def health_head(state: State) -> Response[None]:
    return Response(None, status_code=200 if service_of(state).readiness()[0] == "ok" else 503)


@get(
    "/metrics",
    summary="Prometheus metrics",
    media_type="text/plain; version=0.0.4",
    responses={401: ERRORS[401]},
)
async def metrics(state: State) -> bytes:
    return await service_of(state).metrics_text()


@post(
    [*COHERE_EMBED_V1.paths, *COHERE_EMBED_V2.paths],
    summary="Create embeddings (Cohere)",
    description="Cohere's embed API, v1 and v2: texts, input_type, embedding_types (float, int8, uint8, binary, "
    "ubinary, base64), truncate NONE/START/END, output_dimension. v1 without embedding_types answers "
    "embeddings_floats, otherwise embeddings_by_type.",
    responses={200: ResponseSpec(cohere.CohereEmbedResponse), **ERRORS},
    status_code=200,
)
async def cohere_embed(
    data: Annotated[
        cohere.CohereEmbedRequest,
        Body(
            examples=[
                Example(
                    summary="Two documents",
                    value={
                        "model": "sentence-transformers/all-MiniLM-L6-v2",
                        "texts": ["first text", "second text"],
                        "input_type": "search_document",
                        "embedding_types": ["float"],
                    },
                )
            ]
        ),
    ],
    request: Request[Any, Any, Any],
    state: State,
) -> Response[cohere.CohereEmbedResponse]:
    return await _answer(BY_PATH[request.url.path], data, request, state)  # v1 or v2


@post(
    list(TEI_EMBED.paths),
    summary="Create embeddings (TEI)",
    description="Text Embeddings Inference's /embed: a bare array of vectors, L2-normalized unless normalize is false.",
    responses={200: ResponseSpec(list[list[float]], examples=[Example(value=[[0.0123, -0.0456]])]), **ERRORS},
    status_code=200,
)
async def tei_embed(
    data: Annotated[tei.TEIEmbedRequest, Body(examples=[Example(summary="Two texts", value={"inputs": ["a", "b"]})])],
    request: Request[Any, Any, Any],
    state: State,
) -> Response[list[list[float]]]:
    return await _answer(TEI_EMBED, data, request, state)


@post(
    list(RERANK_EITHER.paths),
    summary="Rerank (TEI's or Cohere's shape)",
    description="A body with texts is TEI's rerank and answers [{index, score, text?}]; a body with documents is "
    "Cohere's, as vLLM and Infinity serve it on /rerank, and answers as /v1/rerank.",
    responses={200: ResponseSpec(RerankResponse, description="Cohere's shape; TEI's for a body with texts"), **ERRORS},
    status_code=200,
)
async def rerank_either(request: Request[Any, Any, Any], state: State) -> Response[Any]:
    return await _answer(RERANK_EITHER, decoded_body(request), request, state)


@post(
    list(TEI_ROOT.paths),
    summary="Embed or rerank (TEI's predict route)",
    description="TEI's root route: a body with inputs embeds (as /embed), one with texts reranks (as TEI's /rerank).",
    responses={200: ResponseSpec(list[list[float]], description="As /embed; as TEI's /rerank for texts"), **ERRORS},
    status_code=200,
)
async def tei_root(request: Request[Any, Any, Any], state: State) -> Response[Any]:
    return await _answer(TEI_ROOT, decoded_body(request), request, state)


@post(
    list(TEI_EMBED_SPARSE.paths),
    summary="Sparse embeddings (TEI)",
    description="Text Embeddings Inference's /embed_sparse for SPLADE models: per input, its non-zero weights as "
    "[{index, value}] by vocabulary index.",
    responses={200: ResponseSpec(list[list[tei.SparseValue]]), **ERRORS},
    status_code=200,
)
async def tei_embed_sparse(
    data: Annotated[
        tei.TEIEmbedSparseRequest, Body(examples=[Example(summary="One text", value={"inputs": "green tea"})])
    ],
    request: Request[Any, Any, Any],
    state: State,
) -> Response[list[list[tei.SparseValue]]]:
    return await _answer(TEI_EMBED_SPARSE, data, request, state)


@post(
    list(TEI_TOKENIZE.paths),
    summary="Tokenize (TEI)",
    description="Text Embeddings Inference's /tokenize: every token of each input with its id, text and span.",
    responses={200: ResponseSpec(list[list[tei.SimpleToken]]), **ERRORS},
    status_code=200,
)
async def tei_tokenize(
    data: Annotated[tei.TEITokenizeRequest, Body(examples=[Example(summary="One text", value={"inputs": "test"})])],
    request: Request[Any, Any, Any],
    state: State,
) -> Response[list[list[tei.SimpleToken]]]:
    return await _answer(TEI_TOKENIZE, data, request, state)


@get("/info", summary="Model information (TEI)", responses={401: ERRORS[401], 503: ERRORS[503]})
async def tei_info(pool: ModelPool, state: State) -> tei.Info:
    return tei.info(pool, service_of(state).settings)


@get(
    ["/openapi.json", "/schema/openapi.json"],
    include_in_schema=False,
    media_type="application/vnd.oai.openapi+json",
    sync_to_thread=False,
)
def openapi_document(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The API's OpenAPI description, as ``/docs/openapi.json`` (Swagger UI's and ReDoc's) serves it."""
    return request.app.openapi_schema.to_schema()


# the API's description and its pages: open without a key unless `public_docs` is off
DOC_PATHS = frozenset({"/openapi.json", "/schema/openapi.json", "/docs", "/docs/", "/docs/redoc", "/docs/openapi.json"})

ROUTE_HANDLERS = (
    *(h for h in file_routes.HANDLERS if h not in file_routes.FILE_HANDLERS),  # uploads: service.app
    *batch_routes.HANDLERS,
    *vector_store_routes.HANDLERS,
    embeddings,
    rerank,
    tokenize,
    models_route,
    health,
    health_head,
    metrics,
    cohere_embed,
    tei_embed,
    tei_embed_sparse,
    rerank_either,
    tei_root,
    tei_tokenize,
    tei_info,
    openapi_document,
)
"""The one route table: the app serves these handlers, metrics label requests by their paths, and each POST
body is decoded against the type of its handler's ``data`` parameter."""
ROUTES = frozenset(path for handler in (*ROUTE_HANDLERS, *file_routes.FILE_HANDLERS) for path in handler.paths)


def _body_types() -> dict[str, type]:
    bodies: dict[str, type] = {}
    for handler in ROUTE_HANDLERS:
        data = get_type_hints(handler.fn, include_extras=True).get("data")
        if data is not None:
            for path in handler.paths:
                bodies[path] = get_args(data)[0] if get_args(data) else data
    return bodies


BODIES: dict[str, Any] = {**_body_types(), **endpoints.BODIES}
"""The schema each POST path's body is decoded against: the endpoint table's, and the batch routes' (from their
handlers' ``data``)."""

_BODY_TEMPLATES = [(path, schema) for path, schema in BODIES.items() if "{" in path]


def body_schema(path: str) -> Any | None:
    """The schema a POST to ``path`` is decoded against: its route's (a route with path parameters by its
    template, ``/v1/vector_stores/{vector_store_id:str}/search``); None for a route that takes no body."""
    found = BODIES.get(path)
    if found is None and _BODY_TEMPLATES:
        found = next((schema for template, schema in _BODY_TEMPLATES if matches_route(template, path)), None)
    return found
