"""The published OpenAPI schema, completed so that it says exactly what the server enforces.

Litestar generates the schema from the request structs; :func:`complete_openapi` adds what its generator
cannot see (bounds inside unions, the configured limits, the served models). ``eval/fuzz_api.py`` checks
the result with schemathesis: a request the schema calls valid is accepted, one it calls invalid refused.
"""

from __future__ import annotations

from litestar import Litestar
from litestar.openapi.spec import OpenAPIType, Schema

from service.models import ModelPool
from service.schemas import INT32_MAX
from service.settings import Limits


def complete_openapi(app: Litestar, limits: Limits, pool: ModelPool) -> None:
    """Make the published schema say what the server enforces where Litestar's generator cannot, so that a
    request the schema calls valid is accepted and one it calls invalid is refused:

    - the bounds msgspec checks inside unions (non-empty texts and lists, ``dimensions``/``top_n`` >= 1, 1 to 16 ``embedding_types``)
      and that a query is not only whitespace;
    - the configured limits (``max_inputs``, ``max_documents``, ``max_text_chars``);
    - the served models: ``model`` is an ``enum`` of the ids and aliases that serve the route (those of
      ``/v1/models``), ``dimensions`` is at most the largest served embedding dimension, ``prompt_name``
      one of the served prompts (only null when no model has prompts), and not given with ``input_type``;
    - ``/health`` needs no key.
    """
    schemas = app.openapi_schema.components.schemas or {}
    embeddings, reranking = schemas["EmbeddingsRequest"], schemas["RerankRequest"]
    tokenizing = schemas["TokenizeRequest"]
    for body in (embeddings, tokenizing):
        text, texts = body.properties["input"].one_of  # type: ignore[index, union-attr, misc]
        text.min_length = texts.items.min_length = 1  # type: ignore[union-attr]
        text.max_length = texts.items.max_length = limits.max_text_chars  # type: ignore[union-attr]
        texts.min_items, texts.max_items = 1, limits.max_inputs  # type: ignore[union-attr]
    query = reranking.properties["query"]  # type: ignore[index]
    query.max_length, query.pattern = limits.max_text_chars, r"\S"  # type: ignore[union-attr]  # not only whitespace
    documents = reranking.properties["documents"]  # type: ignore[index]
    documents.max_items = limits.max_documents  # type: ignore[union-attr]
    for item in documents.items.one_of:  # type: ignore[union-attr]
        if getattr(item, "type", None) == OpenAPIType.STRING:  # the other is a reference to RerankDocument
            item.max_length = limits.max_text_chars  # type: ignore[union-attr]
    schemas["RerankDocument"].properties["text"].max_length = limits.max_text_chars  # type: ignore[index, union-attr]
    for body, field in ((embeddings, "dimensions"), (reranking, "top_n"), (reranking, "max_chunks_per_doc")):
        number = body.properties[field].one_of[0]  # type: ignore[index, union-attr]
        number.minimum, number.maximum = 1, INT32_MAX  # type: ignore[union-attr]
    types = embeddings.properties["embedding_types"].one_of[0]  # type: ignore[index, union-attr]
    types.min_items, types.max_items = 1, 16  # type: ignore[union-attr]
    dims = [s.spec.dimension for s in pool.models.values() if "embeddings" in s.capabilities and s.spec.dimension]
    if dims:
        embeddings.properties["dimensions"].one_of[0].maximum = max(dims)  # type: ignore[index, union-attr]
    for body, capability in ((embeddings, "embeddings"), (tokenizing, "embeddings"), (reranking, "rerank")):
        names = [m for m, s in pool.models.items() if capability in s.capabilities]
        names += [a for a, m in pool.aliases.items() if capability in pool.models[m].capabilities]
        body.properties["model"].enum = names  # type: ignore[index, union-attr]
        body.properties["model"].examples = names[:1]  # type: ignore[index, union-attr]
    names = sorted({n for s in pool.models.values() if "embeddings" in s.capabilities for n in s.spec.prompts})
    for body in (embeddings, tokenizing):
        prompt_name = body.properties["prompt_name"]  # type: ignore[index]
        text = next(o for o in prompt_name.one_of if getattr(o, "type", None) == OpenAPIType.STRING)  # type: ignore[union-attr]
        if names:
            text.enum = names  # type: ignore[union-attr]
        else:  # no served model has prompts: only null is valid
            prompt_name.one_of = [o for o in prompt_name.one_of if o is not text]  # type: ignore[union-attr]
        # input_type and prompt_name both select a prompt: one of them at most
        body.schema_not = Schema(  # type: ignore[union-attr]
            properties={"input_type": Schema(type=OpenAPIType.STRING), "prompt_name": Schema(type=OpenAPIType.STRING)},
            required=["input_type", "prompt_name"],
        )
    health = (app.openapi_schema.paths or {})["/health"]
    for operation in (health.get, health.head):
        if operation is not None:
            operation.security = []  # open: overrides the document-wide bearer requirement
