"""Request and response bodies (msgspec Structs). Litestar builds the OpenAPI schema from these."""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from service.errors import NO_NUL

NonEmptyText = Annotated[str, Meta(min_length=1)]
INT32_MAX = 2**31 - 1
TokenId = Annotated[int, Meta(ge=0, le=INT32_MAX)]
WHITESPACE = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
"""What a text made only of is blank, as a regex class's members: ECMAScript's ``\\s``, the whitespace of the
published schema's patterns (Python's ``\\s`` also takes U+001C-U+001F and U+0085, not U+FEFF)."""
NOT_BLANK = f"[^{WHITESPACE}]"
"""A pattern that a text not only whitespace matches (the published schema's ``\\S``)."""
_BLANK = re.compile(f"[{WHITESPACE}]*")


def blank(text: str) -> bool:
    """Whether ``text`` is empty or only whitespace (:data:`WHITESPACE`).

    >>> blank(" \\u3000"), blank("\\x1d"), blank("a ")
    (True, False, False)
    """
    return _BLANK.fullmatch(text) is not None


Adapter = Annotated[
    NonEmptyText | None,
    Meta(
        description="embedrank: one of the model's LoRA adapters by name (GET /v1/models lists them; a reranking "
        "request: a cross-encoder's); an unknown name is a 400 that lists them",
        examples=["retrieval.query"],
    ),
]
"""A request's ``adapter`` field (OpenAI's, Cohere's and TEI's bodies, embedding and reranking)."""
Task = Annotated[
    NonEmptyText | None,
    Meta(
        description="Jina's task: the model's LoRA adapter of that name with its prompt (jina-embeddings-v3's "
        "`retrieval.query`, `retrieval.passage`, `text-matching`, ...); `retrieval.query` and `retrieval.passage` "
        "pick the retrieval adapter of their role, or on a model without adapters its query or document prompt; "
        "another task the model has no adapter for is a 400 that lists its adapters",
        examples=["retrieval.query"],
    ),
]
"""An embedding request's ``task`` field (Jina's, on OpenAI's body and ``/v1/tokenize``'s)."""
Priority = Annotated[
    int,
    Meta(
        ge=-INT32_MAX - 1,
        le=INT32_MAX,
        description="Scheduling priority, as vLLM: lower is served first (default 0; negative is urgent)",
    ),
]


EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary"]
OutputType = Literal[EmbeddingType, "sparse", "multivector"]  # /v1/embeddings: bge-m3's other outputs too
Compact = Annotated[
    list[float] | str,
    Meta(
        description="The vector in this type (integers for every type but float); with encoding_format=base64, "
        "a base64 string of its bytes (little-endian float32, int8, or uint8)"
    ),
]


PURPOSES = ("batch", "assistants", "user_data")
"""The purposes an upload to ``/v1/files`` may have: a batch's input, or a file for vector stores (the two the
openai SDK sends)."""

Metadata = Annotated[
    dict[Annotated[str, Meta(max_length=64, pattern=NO_NUL)], Annotated[str, Meta(max_length=512, pattern=NO_NUL)]],
    Meta(max_length=16, description="up to 16 keys of 64 characters, values of 512 characters"),
]
"""OpenAI's ``metadata`` of an object (a batch, a vector store): at most 16 short string pairs."""


class EmbeddingsRequest(Struct, kw_only=True):
    """An embeddings request: OpenAI's fields (``model``, ``input``, ``encoding_format``, ``dimensions``, ``user``)
    and embedrank's (prompts, ``embedding_types``, chunking, ``truncate``, ``priority``)."""

    model: Annotated[
        str,
        Meta(description="Model identifier of an embedding model", examples=["sentence-transformers/all-MiniLM-L6-v2"]),
    ]
    input: Annotated[
        NonEmptyText
        | Annotated[list[NonEmptyText | TokenId | Annotated[list[TokenId], Meta(min_length=1)]], Meta(min_length=1)],
        Meta(
            description="A single text, a non-empty list of texts, or token ids as OpenAI's API takes them (an array "
            "of ids, or an array of such arrays) in the cl100k_base vocabulary, decoded to text; no text may be empty"
        ),
    ]
    encoding_format: Annotated[
        Literal["float", "base64"],
        Meta(description="`float` (default) or `base64` (little-endian float32, as the OpenAI SDK sends)"),
    ] = "float"
    dimensions: Annotated[
        Annotated[int, Meta(ge=1, le=INT32_MAX)] | None,
        Meta(description="Truncate vectors to this many dimensions (at most the model's), then renormalize"),
    ] = None
    user: Annotated[str | None, Meta(description="Accepted for OpenAI compatibility; ignored")] = None
    input_type: Annotated[
        Literal["query", "document", "search_query", "search_document", "classification", "clustering"] | None,
        Meta(
            description="What the texts are, as Cohere's input_type: selects the model's query or document prompt "
            "(e.g. e5's 'query: ' / 'passage: '); no prompt when the model has none for it",
            examples=["search_query"],
        ),
    ] = None
    prompt_name: Annotated[
        str | None,
        Meta(
            description="One of the model's prompts by name (GET /v1/models lists them); an unknown name is a 400",
            examples=["query"],
        ),
    ] = None
    task: Task = None
    adapter: Adapter = None
    truncate: Annotated[
        bool, Meta(description="Truncate texts longer than the model's max tokens (default). false: reject with 400")
    ] = True
    embedding_types: Annotated[
        Annotated[list[OutputType], Meta(min_length=1, max_length=16)] | None,
        Meta(
            description="Cohere's compact vectors: each data object also gets `embeddings` with one vector per "
            "type listed (`int8`/`uint8`: calibrated 8-bit buckets; `binary`/`ubinary`: sign bits packed 8 per "
            "byte, as sentence-transformers' quantize_embeddings). `embedding` stays the float vector. bge-m3 "
            "models also give `sparse` (lexical weights: `{indices, values}`, token ids ascending) and "
            "`multivector` (one normalized vector per token after CLS; at most EMBEDRANK_MAX_MULTIVECTOR_TOKENS "
            "token vectors per request). ColBERT models answer only with `multivector` asked for: a query's token "
            "vectors for input_type query/search_query, else a document's; `embedding` then holds the normalized "
            "mean of the text's token vectors. SPLADE models answer only with `sparse` asked for (`{indices, "
            "values}`: the text's non-zero weights over the vocabulary, the query route's for an inference-free "
            'SPLADE with input_type query); `embedding` is then empty (`[]`, or `""` with base64): such a '
            "model has no dense vector",
            examples=[["int8", "ubinary"]],
        ),
    ] = None
    chunking: Annotated[
        bool,
        Meta(
            description="Embed a text longer than the model's max tokens window by window and return the "
            "token-weighted mean of the windows, renormalized (vLLM's chunked processing); default false: truncate",
            examples=[True],
        ),
    ] = False
    chunk_overlap: Annotated[
        Annotated[int, Meta(ge=0, le=INT32_MAX)] | None,
        Meta(
            description="With chunking: tokens shared by consecutive windows (default 32, or half the window if "
            "less); more than half the window is a 400",
            examples=[32],
        ),
    ] = None
    modality: Annotated[
        Literal["text", "image"] | None,
        Meta(
            description="What the inputs are (Infinity's field): `image`: every input is an image as a base64 data "
            "URL (`data:image/png;base64,...`); `text`: every input is text; absent: an input that is a base64 "
            "`data:image/...` URL is an image (as NIM sends them), any other is text. Images need an image-text "
            "model (CLIP, SigLIP); remote image URLs are not fetched",
            examples=["image"],
        ),
    ] = None
    priority: Priority = 0


class TokenizeRequest(Struct, kw_only=True):
    """Token counts as ``/v1/embeddings`` would see the same input (TEI's and vLLM's ``tokenize``): its
    ``input_type``, ``prompt_name``, ``task`` and ``adapter`` select the prompt counted as they do there (an adapter
    changes no token, only the prompt a task brings)."""

    model: Annotated[str, Meta(description="Model identifier of an embedding model")]
    input: Annotated[
        NonEmptyText | Annotated[list[NonEmptyText], Meta(min_length=1)],
        Meta(description="A single text, or a non-empty list of texts; no text may be empty"),
    ]
    return_tokens: Annotated[bool, Meta(description="Also return the tokens the model sees")] = False
    input_type: Annotated[
        Literal["query", "document", "search_query", "search_document", "classification", "clustering"] | None,
        Meta(description="As in /v1/embeddings: the prompt it selects is counted", examples=["search_query"]),
    ] = None
    prompt_name: Annotated[
        str | None, Meta(description="As in /v1/embeddings: the named prompt is counted", examples=["query"])
    ] = None
    task: Task = None
    adapter: Adapter = None


class TokenCount(Struct, kw_only=True):
    index: int
    count: Annotated[int, Meta(description="Tokens the model processes (at most max_tokens), as usage reports")]
    untruncated_count: Annotated[int, Meta(description="All tokens of the text, prompt and special tokens included")]
    truncated: Annotated[bool, Meta(description="untruncated_count > max_tokens: /v1/embeddings cuts this text")]
    tokens: list[str] | UnsetType = UNSET


class TokenizeResponse(Struct, kw_only=True):
    object: Literal["list"] = "list"
    model: str
    max_tokens: int
    data: list[TokenCount]


class SparseVector(Struct, kw_only=True):
    """A sparse vector: its non-zero weights by vocabulary index, indices ascending."""

    indices: list[int]
    values: list[float]


class CompactEmbeddings(Struct, kw_only=True, omit_defaults=True):
    """One vector per requested ``embedding_types`` entry (Cohere's ``embeddings`` object)."""

    float: Compact | UnsetType = UNSET
    int8: Compact | UnsetType = UNSET
    uint8: Compact | UnsetType = UNSET
    binary: Compact | UnsetType = UNSET
    ubinary: Compact | UnsetType = UNSET
    sparse: Annotated[
        SparseVector | UnsetType, Meta(description="A SPLADE's weights or bge-m3's lexical weights over the vocabulary")
    ] = UNSET
    multivector: Annotated[
        list[Compact] | UnsetType,
        Meta(description="bge-m3's or a ColBERT model's token vectors (a base64 string each with base64)"),
    ] = UNSET


class Embedding(Struct, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: Annotated[list[float] | str, Meta(description="The vector; a base64 string when encoding_format=base64")]
    embeddings: Annotated[
        CompactEmbeddings | UnsetType, Meta(description="With embedding_types: the vector in each type asked for")
    ] = UNSET


class EmbeddingUsage(Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int
    chunked_inputs: Annotated[
        int | UnsetType, Meta(description="With chunking: the inputs longer than one window, embedded as several")
    ] = UNSET


class EmbeddingList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class RerankDocument(Struct, kw_only=True):
    text: str


class RerankRequest(Struct, kw_only=True):
    """A rerank request. Documents may be ``{"text": ...}`` objects or plain strings (Cohere v2, Jina, vLLM)."""

    model: Annotated[str, Meta(description="Model identifier of a reranking model")]
    query: Annotated[str, Meta(min_length=1, description="The search query")]
    documents: Annotated[
        list[RerankDocument | str], Meta(min_length=1, description='Candidates: {"text": ...} objects or strings')
    ]
    top_n: Annotated[
        Annotated[int, Meta(ge=1, le=INT32_MAX)] | None,
        Meta(description="Number of top results to return (default: all; more than the documents: all)"),
    ] = None
    return_documents: Annotated[bool, Meta(description="Include each document's text in the results")] = False
    truncate: Annotated[
        bool,
        Meta(
            description="Cut what the chunking limits leave out, and an over-long query (default). false: reject "
            "with 400 instead"
        ),
    ] = True
    max_chunks_per_doc: Annotated[
        Annotated[int, Meta(ge=1, le=INT32_MAX)] | None,
        Meta(
            description="Cohere v1: a document longer than the model's window is scored as up to this many "
            "overlapping windows (default: as many as max_tokens_per_doc needs); 1 scores the first window only",
            examples=[10],
        ),
    ] = None
    max_tokens_per_doc: Annotated[
        int,
        Meta(
            ge=1,
            le=INT32_MAX,
            description="Cohere v2: at most this many tokens of each document are scored (default 4096)",
            examples=[4096],
        ),
    ] = 4096
    chunk_overlap: Annotated[
        Annotated[int, Meta(ge=0, le=INT32_MAX)] | None,
        Meta(
            description="Tokens shared by consecutive windows (default 32, or half the window if less); more than "
            "half the window is a 400",
            examples=[32],
        ),
    ] = None
    chunk_aggregation: Annotated[
        Literal["max", "mean", "first"],
        Meta(description="A chunked document's score: its best window (default), the mean, or the first window"),
    ] = "max"
    priority: Priority = 0
    adapter: Adapter = None


class RerankResult(Struct, kw_only=True):
    index: int
    relevance_score: float
    document: RerankDocument | UnsetType = UNSET


class RerankUsage(Struct, kw_only=True):
    total_tokens: Annotated[int, Meta(description="Tokens processed: the query and every window of every document")]
    chunked_documents: Annotated[int, Meta(description="Documents longer than one window, scored as several")] = 0


class CohereApiVersion(Struct, kw_only=True):
    version: str


class CohereBilledUnits(Struct, kw_only=True):
    input_tokens: int


class CohereMeta(Struct, kw_only=True, omit_defaults=True):
    api_version: CohereApiVersion
    billed_units: CohereBilledUnits
    warnings: list[str] | UnsetType = UNSET


def cohere_meta(version: str, tokens: int, truncated: int) -> CohereMeta:
    """Cohere's ``meta``: the API version, the tokens processed, and a warning when inputs were cut."""
    warnings = [f"{truncated} input(s) were longer than the model's window and were truncated"] if truncated else []
    return CohereMeta(
        api_version=CohereApiVersion(version=version),
        billed_units=CohereBilledUnits(input_tokens=tokens),
        warnings=warnings or UNSET,
    )


class RerankResponse(Struct, kw_only=True):
    id: Annotated[str, Meta(description='"rerank-" followed by a random uuid hex')]
    results: Annotated[list[RerankResult], Meta(description="Sorted by relevance_score, highest first; ties by index")]
    model: str
    usage: RerankUsage
    meta: Annotated[
        CohereMeta | UnsetType, Meta(description="Cohere's meta: the API version and the tokens processed")
    ] = UNSET


class ModelCard(Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "embedrank"
    capabilities: Annotated[
        list[Literal["embeddings", "rerank", "sparse"]],
        Meta(
            description="What it serves: embeddings (/v1/embeddings and the other embedding routes), rerank, sparse "
            "(/embed_sparse)"
        ),
    ]
    outputs: Annotated[
        list[Literal["dense", "sparse", "multivector"]],
        Meta(
            description="The vectors it gives: dense (embedding_types float and the compact types), sparse "
            '(embedding_types ["sparse"]: {indices, values} over the vocabulary) and multivector (one vector per '
            "token); empty for a model that only reranks"
        ),
    ] = msgspec.field(default_factory=list)
    scorer: Annotated[
        Literal["cross-encoder", "bi-encoder", "bge-m3", "colbert"] | None,
        Meta(
            description="How /v1/rerank scores with this model (bge-m3: its dense, lexical and multi-vector scores "
            "weighted 0.4, 0.2, 0.4; colbert: MaxSim, the sum over the query's token vectors of the best dot "
            "product with the document's); null for a model that does not rerank"
        ),
    ]
    inputs: Annotated[
        list[Literal["text", "image"]],
        Meta(description="What it embeds: text, and image for an image-text model (CLIP, SigLIP)"),
    ] = msgspec.field(default_factory=lambda: ["text"])
    dimension: int | None
    max_tokens: int
    aliases: list[str] = msgspec.field(default_factory=list)
    prompts: Annotated[
        dict[str, str], Meta(description="The model's named prompts (input_type and prompt_name select them)")
    ] = msgspec.field(default_factory=dict)
    adapters: Annotated[
        list[str],
        Meta(description="The LoRA adapters it runs over its base model (a request's `adapter` or `task` picks one)"),
    ] = msgspec.field(default_factory=list)
    backend: Annotated[
        str, Meta(description="What runs the transformer: torch, openvino, onnx (fake: no weights; auto until loaded)")
    ]
    precision: Annotated[
        str, Meta(description="The precision: fp32, bf16 or int8 (auto until loaded, then what auto chose)")
    ]
    inference_precision: Annotated[
        str | None,
        Meta(description="What really computes (f32, bf16, int8+f32), read from the runtime; null until loaded"),
    ] = None
    fallback_reason: Annotated[
        str | None,
        Meta(description="Why the model runs on torch although no backend was named (its export failed); else null"),
    ] = None
    auto_choice: Annotated[
        str | None,
        Meta(
            description="What backend or precision 'auto' chose on this machine and why (the measured speed "
            "ratios and quality of every candidate); null when both were set explicitly or until loaded"
        ),
    ] = None


class ModelList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(Struct, kw_only=True):
    status: Literal["ok", "loading", "draining", "failed"]
    detail: str | None = None


class ErrorDetail(Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(Struct, kw_only=True):
    error: ErrorDetail


EMBEDDINGS_EXAMPLE_REQUEST = {"model": "sentence-transformers/all-MiniLM-L6-v2", "input": ["first text", "second text"]}
EMBEDDINGS_EXAMPLE_RESPONSE = {
    "object": "list",
    "data": [
        {"object": "embedding", "index": 0, "embedding": [0.0123, -0.0456, 0.0789]},
        {"object": "embedding", "index": 1, "embedding": [0.0321, 0.0654, -0.0987]},
    ],
    "model": "sentence-transformers/all-MiniLM-L6-v2",
    "usage": {"prompt_tokens": 8, "total_tokens": 8},
}
RERANK_EXAMPLE_REQUEST = {
    "model": "sentence-transformers/all-MiniLM-L6-v2",
    "query": "What causes the seasons?",
    "documents": [{"text": "The tilt of Earth's axis causes the seasons."}, {"text": "Bananas are rich in potassium."}],
    "top_n": 2,
    "return_documents": True,
}
RERANK_EXAMPLE_RESPONSE = {
    "id": "rerank-3f2b9c1e8d0a4f6b9e7c5a1d2b3c4d5e",
    "results": [
        {"index": 0, "relevance_score": 0.71, "document": {"text": "The tilt of Earth's axis causes the seasons."}},
        {"index": 1, "relevance_score": 0.02, "document": {"text": "Bananas are rich in potassium."}},
    ],
    "model": "sentence-transformers/all-MiniLM-L6-v2",
    "usage": {"total_tokens": 31},
}
