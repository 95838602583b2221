"""The published OpenAPI schema, completed so that it says exactly what the server enforces.

Litestar generates the schema from the request structs; :func:`complete_openapi` adds what its generator
cannot see (bounds inside unions, the configured limits, the served models). ``eval/fuzz/api.py`` checks
the result with schemathesis: a request the schema calls valid is accepted, one it calls invalid refused.
"""

from __future__ import annotations

from typing import Any, get_args

import msgspec
from litestar import Litestar
from litestar.openapi.spec import Example, OpenAPIMediaType, OpenAPIType, Parameter, Reference, RequestBody, Schema

from embedrank.serving.pool import ModelPool
from service.errors import NO_NUL
from service.schemas import INT32_MAX, PURPOSES, RERANK_EXAMPLE_REQUEST, EmbeddingType
from service.settings import Limits
from service.tei import Rank, TEIRerankRequest

REF = "#/components/schemas/{name}"
EXAMPLES = {"/rerank": RERANK_EXAMPLE_REQUEST, "/": {"inputs": ["first text", "second text"]}}
NULL = Schema(type=OpenAPIType.NULL)
ADAPTER_BODIES = (
    "EmbeddingsRequest",
    "TokenizeRequest",
    "CohereEmbedRequest",
    "TEIEmbedRequest",
    "CreateVectorStoreRequest",
    "RerankRequest",
    "TEIEmbedSparseRequest",
)


def complete_openapi(app: Litestar, limits: Limits, pool: ModelPool, token_ids: bool = True) -> None:
    """Make the published schema say what the server enforces where Litestar's generator cannot, so that a
    request the schema calls valid is accepted and one it calls invalid is refused:

    - the bounds msgspec checks inside unions (non-empty texts and lists, ``dimensions``/``top_n`` >= 1, 1 to 16 ``embedding_types``)
      and that a query is not only whitespace;
    - the configured limits (``max_inputs``, ``max_documents``, ``max_text_chars``);
    - the served models: ``model`` is an ``enum`` of the ids and aliases that serve the route (those of
      ``/v1/models``), ``dimensions`` is at most the largest served embedding dimension, ``prompt_name``
      one of the served prompts (only null when no model has prompts), and not given with ``input_type``;
    - ``adapter`` one of the served adapters, ``task`` one of them or a task of the query or document role;
    - ``embedding_types`` offers ``sparse`` only when a bge-m3 or SPLADE model is served, ``multivector`` when a
      bge-m3 or ColBERT model is (with other models too, asking one of those for them is a 400
      ``output_not_available``);
    - an unknown member of an object that refuses them may be null (the decoder reads null as absent);
    - ``/health`` needs no key.
    """
    schemas = app.openapi_schema.components.schemas or {}
    embeddings, reranking = schemas["EmbeddingsRequest"], schemas["RerankRequest"]
    tokenizing = schemas["TokenizeRequest"]
    _complete_inputs(embeddings.properties["input"], limits, token_ids)  # type: ignore[index, arg-type]
    for body, field in ((tokenizing, "input"), (schemas["TEIEmbedRequest"], "inputs")):
        _complete_inputs(body.properties[field], limits)  # type: ignore[index, arg-type]
    _complete_inputs(schemas["TEITokenizeRequest"].properties["inputs"], limits)  # type: ignore[index, arg-type]
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
    # an overlap over half the window is refused with chunking on (it is unused with chunking off); the window
    # depends on the model, its prompt and the query, which JSON Schema cannot express
    for body in (embeddings, reranking):
        overlap = body.properties["chunk_overlap"].one_of[0]  # type: ignore[index, union-attr]
        overlap.minimum, overlap.maximum = 0, INT32_MAX  # type: ignore[union-attr]
    types = embeddings.properties["embedding_types"].one_of[0]  # type: ignore[index, union-attr]
    types.min_items, types.max_items = 1, 16  # type: ignore[union-attr]
    # sparse: a bge-m3 or SPLADE model's; multivector: a bge-m3 or ColBERT model's (the others answer 400)
    given = {o for s in pool.plans.values() for o in s.outputs}
    types.items.enum = [*get_args(EmbeddingType), *(o for o in ("sparse", "multivector") if o in given)]  # type: ignore[union-attr]
    if not any("image" in plan.declared.inputs for plan in pool.plans.values()):  # no model embeds images
        modality = embeddings.properties["modality"]  # type: ignore[index]
        modality.one_of = [Schema(type=OpenAPIType.STRING, enum=["text"]), NULL]  # type: ignore[union-attr]
    dims = [s.spec.dimension for s in pool.plans.values() if "dense" in s.outputs and s.spec.dimension]
    if dims:
        embeddings.properties["dimensions"].one_of[0].maximum = max(dims)  # type: ignore[index, union-attr]
    for body, capability in ((embeddings, "embeddings"), (tokenizing, "embeddings"), (reranking, "rerank")):
        names = [m for m, s in pool.plans.items() if capability in s.capabilities]
        names += [a for a, m in pool.aliases.items() if capability in pool.plans[m].capabilities]
        body.properties["model"].enum = names  # type: ignore[index, union-attr]
        body.properties["model"].examples = names[:1]  # type: ignore[index, union-attr]
    names = sorted({n for s in pool.plans.values() if "embeddings" in s.capabilities for n in s.spec.prompts})
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
    _complete_adapters(schemas, pool)
    _complete_compat(app, limits, pool)
    for name in ("EmbeddingsRequest", "TokenizeRequest", "RerankRequest", "CohereEmbedRequest", "TEIEmbedRequest"):
        _nullable_optionals(schemas[name])  # type: ignore[arg-type]
    _nullable_optionals(schemas["TEITokenizeRequest"])  # type: ignore[arg-type]
    for name, capability in (
        ("EmbeddingsRequest", "embeddings"),
        ("TokenizeRequest", "embeddings"),
        ("CohereEmbedRequest", "embeddings"),
        ("RerankRequest", "rerank"),
    ):
        if not _serving(pool, capability):  # no served model can answer: no body is valid
            schemas[name] = Schema(schema_not=Schema(), description=f"No served model serves {capability}")
    paths = app.openapi_schema.paths or {}
    for operation in (paths["/health"].get, paths["/health"].head):
        if operation is not None:
            operation.security = []  # open: overrides the document-wide bearer requirement
    schemas["CreateBatchRequest"].additional_properties = False  # type: ignore[union-attr]  # unknown fields: 400
    for option in _options(schemas["CreateBatchRequest"].properties["input_file_id"]):  # type: ignore[index]
        if getattr(option, "type", None) == OpenAPIType.STRING:
            option.pattern = NO_NUL  # an id: no NUL character (a 400 naming it)
    metadata = schemas["CreateBatchRequest"].properties["metadata"]  # type: ignore[index]
    for option in getattr(metadata, "one_of", None) or [metadata]:
        if getattr(option, "type", None) == OpenAPIType.OBJECT:
            option.property_names = STORED_KEY
            _stored_strings(option.additional_properties)
    for item in paths.values():  # a list's cursor is an id: no NUL character (a 400 naming it)
        for parameter in (item.get.parameters or []) if item.get is not None else []:
            if (
                isinstance(parameter, Parameter)
                and parameter.name in ("after", "before")
                and parameter.param_in == "query"
            ):
                for option in getattr(parameter.schema, "one_of", None) or [parameter.schema]:
                    if getattr(option, "type", None) == OpenAPIType.STRING:
                        option.pattern = NO_NUL
    _complete_vector_stores(schemas, limits, pool)
    upload = paths["/v1/files"].post
    if upload is not None:  # the handler reads its multipart form itself (its own size limit, its own errors)
        form = Schema(
            type=OpenAPIType.OBJECT,
            required=["file", "purpose"],
            properties={
                "file": Schema(type=OpenAPIType.STRING, format="binary", description="the JSONL input file"),  # type: ignore[arg-type]
                "purpose": Schema(type=OpenAPIType.STRING, enum=list(PURPOSES)),
            },
        )
        upload.request_body = RequestBody(content={"multipart/form-data": OpenAPIMediaType(schema=form)}, required=True)
    for schema in schemas.values():
        _null_members_only(schema)


def _options(schema: Any) -> list[Any]:
    """The schemas a value may match: a ``oneOf``'s, or the schema itself."""
    return list(getattr(schema, "one_of", None) or [schema])


def _null_members_only(schema: Any, seen: set[int] | None = None) -> None:
    """An object of a JSON body that refuses unknown members (``additionalProperties: false``) takes one whose
    value is null: the decoder reads a null member as an absent one (:func:`~service.decoding.decode_strict`), so
    the schema says that an unknown member may only be null."""
    seen = set() if seen is None else seen
    if not isinstance(schema, Schema) or id(schema) in seen:
        return
    seen.add(id(schema))
    if schema.additional_properties is False:
        schema.additional_properties = NULL
    children: list[Any] = [*(schema.properties or {}).values(), *(schema.one_of or []), *(schema.any_of or [])]
    children += [*(schema.all_of or []), schema.items, schema.additional_properties, schema.schema_not]
    for child in children:
        _null_members_only(child, seen)


STORED_KEY = Schema(type=OpenAPIType.STRING, max_length=64, pattern=NO_NUL)
"""A key of ``metadata`` or ``attributes``: at most 64 characters, no NUL."""


def _stored_strings(values: Any) -> None:
    """The string values of ``metadata`` or ``attributes`` as the decoder bounds them: 512 characters, no NUL."""
    for option in getattr(values, "one_of", None) or [values]:
        if getattr(option, "type", None) == OpenAPIType.STRING:
            option.max_length, option.pattern = 512, NO_NUL


VECTOR_STORE_BODIES = (
    "CreateVectorStoreRequest",
    "UpdateVectorStoreRequest",
    "CreateFileRequest",
    "UpdateFileRequest",
    "CreateFileBatchRequest",
    "FileInBatch",
    "SearchRequest",
    "RankingOptions",
    "HybridSearch",
    "ExpiresAfter",
    "StaticChunking",
    "StaticParams",
    "AutoChunking",
)


def _complete_adapters(schemas: dict[str, Any], pool: ModelPool) -> None:
    """``adapter`` one of the served models' LoRA adapters (only null when none has any), ``task`` one of the embedding
    models' or a task of the query or document role (which every model takes), as the prompt names are completed."""
    plans = list(pool.plans.values())
    names = sorted({n for plan in plans for n in plan.served_adapters})
    tasks = sorted({t for plan in plans if plan.kind == "embedding" for t in plan.task_names()})
    for body, field, allowed in (
        *((schemas.get(name), "adapter", names) for name in ADAPTER_BODIES),
        *((schemas.get(name), "task", tasks) for name in ("EmbeddingsRequest", "TokenizeRequest")),
    ):
        prop = (body.properties or {}).get(field) if body is not None else None
        if prop is None:
            continue
        text = next(o for o in prop.one_of if getattr(o, "type", None) == OpenAPIType.STRING)
        if allowed:
            text.enum, text.examples = allowed, allowed[:1]
        else:  # no served model has adapters: only null is valid
            prop.one_of = [o for o in prop.one_of if o is not text]


def _complete_vector_stores(schemas: dict[str, Any], limits: Limits, pool: ModelPool) -> None:
    """The vector stores' bodies as the decoder reads them: unknown fields refused, null members absent (in
    ``metadata`` and ``attributes`` too), a query not empty nor only whitespace and within ``max_text_chars``, and
    static chunks no larger than the largest served embedding model reads at once (none when no model reads
    100 tokens, OpenAI's smallest chunk)."""
    for name in VECTOR_STORE_BODIES:
        if name in schemas:
            schemas[name].additional_properties = False
            _nullable_optionals(schemas[name])
    for body in (schemas.get(n) for n in VECTOR_STORE_BODIES):
        for prop in (body.properties or {}).values() if body is not None else ():
            for option in getattr(prop, "one_of", None) or [prop]:
                values = getattr(option, "additional_properties", None)
                if isinstance(values, Schema):  # metadata, attributes: a null value is an absent key
                    _stored_strings(values)
                    option.additional_properties = Schema(one_of=[values, Schema(type=OpenAPIType.NULL)])
                    option.property_names = STORED_KEY  # keys as the decoder bounds them
    batch = schemas.get("CreateFileBatchRequest")
    if batch is not None:  # a file batch names at least one file, in file_ids or in files
        batch.any_of = [
            Schema(required=[field], properties={field: Schema(type=OpenAPIType.ARRAY, min_items=1)})
            for field in ("file_ids", "files")
        ]
    hybrid = schemas.get("HybridSearch")
    if hybrid is not None:  # OpenAI's hybrid weights: one of them above 0
        hybrid.any_of = [
            Schema(properties={weight: Schema(type=OpenAPIType.NUMBER, exclusive_minimum=0)})
            for weight in ("embedding_weight", "text_weight")
        ]
    search = schemas.get("SearchRequest")
    if search is not None:  # msgspec's bounds inside a union are lost by the generator
        weight = next(o for o in search.properties["hybrid_weight"].one_of if o.type == OpenAPIType.NUMBER)
        weight.minimum, weight.maximum = 0, 1
        text = Schema(type=OpenAPIType.STRING, min_length=1, max_length=limits.max_text_chars, pattern=r"\S")
        search.properties["query"] = Schema(
            one_of=[text, Schema(type=OpenAPIType.ARRAY, items=text, min_items=1, max_items=10)]
        )
        schemas["AttributeFilter"] = _filter_schema(limits)
        search.properties["filters"] = Schema(
            one_of=[Reference(ref="#/components/schemas/AttributeFilter"), Schema(type=OpenAPIType.NULL)]
        )
    create = schemas.get("CreateVectorStoreRequest")
    dense = [m for m, plan in pool.plans.items() if "dense" in plan.outputs]
    if create is not None and dense:  # a store embeds with a served model that gives dense vectors
        names = dense + [a for a, m in pool.aliases.items() if m in dense]
        model = next(o for o in create.properties["model"].one_of if o.type == OpenAPIType.STRING)
        model.enum, model.examples = names, names[:1]
    sparse = [m for m, plan in pool.plans.items() if "sparse" in plan.outputs]
    for body in (b for b in (create, search) if b is not None):  # SPLADE stages where a SPLADE model is served
        _splade_stages(body, sparse + [a for a, m in pool.aliases.items() if m in sparse])
    windows = [s.spec.max_seq_length - 2 for s in pool.plans.values() if "dense" in s.outputs]
    params = schemas.get("StaticParams")
    if params is not None and windows:
        size = params.properties["max_chunk_size_tokens"]
        size.maximum = min(size.maximum or max(windows), max(windows))
        if max(windows) < 100:  # no served model reads OpenAI's smallest static chunk: auto only
            for name in ("CreateVectorStoreRequest", "CreateFileRequest", "CreateFileBatchRequest", "FileInBatch"):
                strategy = schemas[name].properties.get("chunking_strategy")
                if strategy is not None:
                    strategy.one_of = [o for o in strategy.one_of if "StaticChunking" not in str(getattr(o, "ref", ""))]


def _splade_stages(body: Schema, sparse: list[str]) -> None:
    """A store body's SPLADE choices as the served models allow: ``sparse_model`` one of ``sparse`` (the served
    SPLADE models' ids and aliases) or null; no ``splade`` stage in ``first_stage`` nor ``hybrid_weights`` with
    none served; ``hybrid_weights`` as the decoder reads it (known stages only, at least one, each weight above
    0 and at most 1)."""
    props = body.properties or {}
    stages = ["dense", "bm25", "splade"] if sparse else ["dense", "bm25"]
    if "sparse_model" in props:
        about = getattr(props["sparse_model"], "description", None)
        named = Schema(type=OpenAPIType.STRING, enum=sparse, examples=sparse[:1])
        props["sparse_model"] = (
            Schema(one_of=[named, Schema(type=OpenAPIType.NULL)], description=about)
            if sparse
            else Schema(type=OpenAPIType.NULL, description=about)
        )
    first = props.get("first_stage")
    for option in (getattr(first, "one_of", None) or [first]) if first is not None else []:
        if getattr(option, "enum", None) and not sparse:
            option.enum = [e for e in option.enum if e != "splade"]
    if "hybrid_weights" in props:
        weight = Schema(type=OpenAPIType.NUMBER, exclusive_minimum=0, maximum=1)
        weights = Schema(  # a null member is an absent one: at least one stage with a number
            type=OpenAPIType.OBJECT,
            properties={stage: Schema(one_of=[weight, NULL]) for stage in stages},
            additional_properties=False,
            any_of=[Schema(required=[stage], properties={stage: weight}) for stage in stages],
        )
        props["hybrid_weights"] = Schema(
            one_of=[weights, Schema(type=OpenAPIType.NULL)],
            description=getattr(props["hybrid_weights"], "description", None),
        )


def _filter_schema(limits: Limits) -> Schema:
    """OpenAI's attribute filter (:mod:`embedrank.retrieval.filters`): a comparison, or ``and``/``or`` of filters."""
    scalar = [Schema(type=OpenAPIType.STRING), Schema(type=OpenAPIType.NUMBER)]

    def comparison(ops: list[str], value: Schema) -> Schema:
        return Schema(
            type=OpenAPIType.OBJECT,
            required=["type", "key", "value"],
            additional_properties=False,
            properties={
                "type": Schema(type=OpenAPIType.STRING, enum=ops),
                "key": Schema(type=OpenAPIType.STRING, min_length=1),
                "value": value,
            },
        )

    compound = Schema(
        type=OpenAPIType.OBJECT,
        required=["type", "filters"],
        additional_properties=False,
        properties={
            "type": Schema(type=OpenAPIType.STRING, enum=["and", "or"]),
            "filters": Schema(
                type=OpenAPIType.ARRAY,
                min_items=1,
                max_items=limits.max_filter_clauses,
                items=Reference(ref="#/components/schemas/AttributeFilter"),
            ),
        },
    )
    return Schema(
        one_of=[
            comparison(["eq", "ne"], Schema(one_of=[*scalar, Schema(type=OpenAPIType.BOOLEAN)])),
            comparison(["gt", "gte", "lt", "lte"], Schema(one_of=scalar)),
            comparison(
                ["in", "nin"],
                Schema(type=OpenAPIType.ARRAY, max_items=limits.max_filter_clauses, items=Schema(one_of=scalar)),
            ),
            compound,
        ],
        description=f"at most {limits.max_filter_clauses} clauses, nested at most {limits.max_filter_depth} deep",
    )


# cl100k_base: ids 0..100276, of which these are unassigned
TOKEN_ID = Schema(
    type=OpenAPIType.INTEGER, minimum=0, maximum=100276, schema_not=Schema(enum=[100256, *range(100261, 100276)])
)


def _complete_inputs(inputs: Schema, limits: Limits, token_ids: bool = False) -> None:
    """Bounds of an ``input``: a text, or a list of texts (and, for /v1/embeddings, of token ids or
    token-id arrays), within ``max_inputs`` items of at most ``max_text_chars`` characters or ids."""
    text, texts = inputs.one_of  # type: ignore[misc]
    items = texts.items  # type: ignore[union-attr]
    for item in items.one_of or [items]:  # type: ignore[union-attr]
        if getattr(item, "type", None) == OpenAPIType.STRING:
            item.min_length, item.max_length = 1, limits.max_text_chars  # type: ignore[union-attr]
    text.min_length, text.max_length = 1, limits.max_text_chars  # type: ignore[union-attr]
    texts.min_items, texts.max_items = 1, limits.max_inputs  # type: ignore[union-attr]
    if items.one_of:  # type: ignore[union-attr]
        # a flat array of ids is one input (as many ids as one text may hold characters), else arrays of them
        array = Schema(type=OpenAPIType.ARRAY, min_items=1, max_items=limits.max_text_chars, items=TOKEN_ID)
        strings = [o for o in items.one_of if o.type == OpenAPIType.STRING]  # type: ignore[union-attr]
        texts.items = Schema(one_of=[*strings, array]) if token_ids else strings[0]  # type: ignore[union-attr]
        inputs.one_of = [text, texts, array] if token_ids else [text, texts]


def _nullable_optionals(body: Schema | dict[str, Any]) -> None:
    """Every optional property of a request body may also be null, which the server reads as absent."""
    if isinstance(body, dict):
        required = set(body.get("required", ()))
        for name, prop in body["properties"].items():
            if name not in required and not _allows_null(prop):
                body["properties"][name] = {"anyOf": [prop, {"type": "null"}]}
        return
    required = set(body.required or ())
    for name, prop in (body.properties or {}).items():
        if name in required or _allows_null(prop):
            continue
        if isinstance(prop, Schema) and prop.one_of is not None:
            prop.one_of = [*prop.one_of, NULL]
            continue
        description = getattr(prop, "description", None)
        if isinstance(prop, Schema):
            prop.description = None
        body.properties[name] = Schema(one_of=[prop, NULL], description=description)  # type: ignore[index]


def _allows_null(prop: Any) -> bool:
    if isinstance(prop, dict):
        return prop.get("type") == "null" or any(_allows_null(p) for p in prop.get("anyOf", ()))
    if isinstance(prop, Schema):
        return prop.type == OpenAPIType.NULL or any(_allows_null(p) for p in prop.one_of or ())
    return False


def _serving(pool: ModelPool, capability: str) -> list[str]:
    names = [m for m, s in pool.plans.items() if capability in s.capabilities]
    return names + [a for a, m in pool.aliases.items() if capability in pool.plans[m].capabilities]


def _complete_compat(app: Litestar, limits: Limits, pool: ModelPool) -> None:
    """Cohere's embed and TEI's bodies: the same limits and served models as the native routes, and the two
    routes whose body decides the protocol (``/rerank`` and ``POST /``) as a ``oneOf`` of both shapes."""
    schemas = app.openapi_schema.components.schemas  # type: ignore[union-attr]
    embeddings = schemas["EmbeddingsRequest"].properties  # type: ignore[union-attr]
    cohere = schemas["CohereEmbedRequest"]
    texts = cohere.properties["texts"].one_of[0]  # type: ignore[index, union-attr]
    texts.min_items, texts.max_items = 1, limits.max_inputs  # type: ignore[union-attr]
    texts.items.min_length, texts.items.max_length = 1, limits.max_text_chars  # type: ignore[union-attr]
    cohere.properties["model"].enum = _serving(pool, "embeddings")  # type: ignore[index, union-attr]
    cohere.properties["output_dimension"] = embeddings["dimensions"]  # type: ignore[index]
    if not any("image" in plan.declared.inputs for plan in pool.plans.values()):
        # no served model embeds images: texts is required, and images and inputs only absent (or null)
        cohere.properties["texts"] = texts  # type: ignore[index]
        cohere.required = sorted({*(cohere.required or []), "texts"})  # type: ignore[union-attr]
        for field in ("images", "inputs"):
            cohere.properties[field] = Schema(one_of=[NULL], description="No served model embeds images")  # type: ignore[index]
    else:
        images = cohere.properties["images"].one_of[0]  # type: ignore[index, union-attr]
        images.max_items = limits.max_images  # type: ignore[union-attr]
        images.items.pattern = "^data:image/"  # type: ignore[union-attr]
        cohere.properties["inputs"].one_of[0].max_items = limits.max_inputs  # type: ignore[index, union-attr]
    types = cohere.properties["embedding_types"].one_of[0]  # type: ignore[index, union-attr]
    types.min_items, types.max_items = 1, 16  # type: ignore[union-attr]
    windows = [s.spec.max_seq_length for s in pool.plans.values() if "embeddings" in s.capabilities]
    max_tokens = cohere.properties["max_tokens"].one_of[0]  # type: ignore[index, union-attr]
    max_tokens.minimum, max_tokens.maximum = max(windows, default=1), INT32_MAX  # type: ignore[union-attr]
    for name in ("TEIEmbedRequest", "TEITokenizeRequest", "TEIEmbedSparseRequest"):
        tei = schemas[name].properties  # type: ignore[union-attr]
        capability = "sparse" if name == "TEIEmbedSparseRequest" else "embeddings"
        tei["model"].one_of[0].enum = _serving(pool, capability) or None  # type: ignore[index, union-attr]
        prompts = sorted({n for m in pool.plans.values() if capability in m.capabilities for n in m.spec.prompts})
        tei["prompt_name"] = (  # type: ignore[index]
            Schema(one_of=[Schema(type=OpenAPIType.STRING, enum=prompts), NULL]) if prompts else Schema(one_of=[NULL])
        )
        if not _serving(pool, capability):  # no served model can answer: no body is valid
            schemas[name] = Schema(schema_not=Schema(), description=f"No served model serves {capability}")  # type: ignore[index]
    sparse = schemas["TEIEmbedSparseRequest"]
    if isinstance(sparse, Schema) and sparse.properties:
        _complete_inputs(sparse.properties["inputs"], limits)  # type: ignore[arg-type]
        sparse.properties["truncation_direction"] = Schema(  # type: ignore[index]
            enum=["Right", "right"], description="Only Right is supported for sparse models"
        )
        _nullable_optionals(sparse)
    if schemas["TEIEmbedRequest"].properties:  # type: ignore[union-attr]  # (an embedding model is served)
        schemas["TEIEmbedRequest"].properties["dimensions"] = embeddings["dimensions"]  # type: ignore[index, union-attr]
    _, extra = msgspec.json.schema_components([TEIRerankRequest, Rank], ref_template=REF)
    rerank = extra["TEIRerankRequest"]["properties"]
    rerank["query"].update(maxLength=limits.max_text_chars, pattern=r"\S")
    rerank["texts"].update(maxItems=limits.max_documents)
    rerank["texts"]["items"].update(maxLength=limits.max_text_chars)
    rerank["truncation_direction"] = {"enum": ["Right", "right"], "description": "Only Right is supported for pairs"}
    rerank["model"]["anyOf"][0]["enum"] = _serving(pool, "rerank")
    adapters = sorted({n for plan in pool.plans.values() for n in plan.served_adapters})
    if adapters:  # as ADAPTER_BODIES' (_complete_adapters)
        rerank["adapter"]["anyOf"][0].update(enum=adapters, examples=adapters[:1])
    else:
        rerank["adapter"] = {"type": "null", "description": rerank["adapter"].get("description", "")}
    if any((plan.spec.num_labels or 1) != 1 for plan in pool.plans.values() if "rerank" in plan.capabilities):
        rerank["raw_scores"] = {"enum": [False], "description": "Only false: a served model has several labels"}
    _nullable_optionals(extra["TEIRerankRequest"])
    for name, value in extra.items():
        schemas.setdefault(name, value)  # type: ignore[union-attr, arg-type]
    paths = app.openapi_schema.paths or {}
    for path, other in (("/rerank", "RerankRequest"), ("/", "TEIEmbedRequest")):
        choice = Schema(
            one_of=[
                Reference(ref=REF.format(name="TEIRerankRequest")),
                Schema(all_of=[Reference(ref=REF.format(name=other)), Schema(schema_not=Schema(required=["texts"]))]),
            ]
        )
        examples: dict[str, Example | Reference] = {
            "tei-rerank": Example(
                summary="TEI's rerank", value={"query": "What is Deep Learning?", "texts": ["Deep Learning is ..."]}
            ),
            "other": Example(summary="Cohere's rerank" if path == "/rerank" else "TEI's embed", value=EXAMPLES[path]),
        }
        paths[path].post.request_body = RequestBody(  # type: ignore[union-attr]
            content={"application/json": OpenAPIMediaType(schema=choice, examples=examples)}, required=True
        )
    ranks = Schema(type=OpenAPIType.ARRAY, items=Reference(ref=REF.format(name="Rank")))
    answers: tuple[tuple[str, Reference | None], ...] = (
        ("/rerank", Reference(ref=REF.format(name="RerankResponse"))),
        ("/", None),  # as /embed, or TEI's ranks
    )
    for path, first in answers:
        ok = paths[path].post.responses["200"]  # type: ignore[union-attr, index]
        media = ok.content["application/json"]  # type: ignore[union-attr, index]
        media.schema = Schema(one_of=[first or media.schema, ranks])  # type: ignore[list-item]
