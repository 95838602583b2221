"""OpenAI's Vector Stores API objects as the service reads and sends them (msgspec), with the documented
extensions a store is created with (``model``, ``sparse_model``, ``first_stage``, ``hybrid_weight`` or
``hybrid_weights``, ``index``) and a search may ask for (``rerank_candidates``, ``first_stage``, the hybrid's
weights); the openai SDK sends the extensions as ``extra_body``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from embedrank.retrieval.store import Stage, StoreIndexKind, hybrid_weights
from service.errors import NO_NUL
from service.schemas import NOT_BLANK, Metadata
from service.vector_stores.store import BatchRow, FileCounts, FileRow, StoreState

AttributeValue = Annotated[str, Meta(max_length=512, pattern=NO_NUL)] | float | bool
FileAttributes = Annotated[
    dict[Annotated[str, Meta(max_length=64, pattern=NO_NUL)], AttributeValue],
    Meta(
        max_length=16, description="up to 16 keys of 64 characters; values strings of 512 characters, numbers, booleans"
    ),
]
AUTO_CHUNK = (800, 400)
"""OpenAI's ``auto`` chunking: 800 tokens a chunk, 400 of overlap (at most the store model's window, and half)."""


class StaticParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    max_chunk_size_tokens: Annotated[int, Meta(ge=100, le=4096)]
    chunk_overlap_tokens: Annotated[int, Meta(ge=0)]


class AutoChunking(msgspec.Struct, tag_field="type", tag="auto", forbid_unknown_fields=True):
    pass


class StaticChunking(msgspec.Struct, tag_field="type", tag="static", forbid_unknown_fields=True):
    static: StaticParams


ChunkingStrategy = AutoChunking | StaticChunking


class ExpiresAfter(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    anchor: Literal["last_active_at"]
    days: Annotated[int, Meta(ge=1, le=365)]


HybridWeights = Annotated[
    dict[Stage, Annotated[float, Meta(gt=0, le=1)]],
    Meta(
        min_length=1,
        description="the stages a hybrid fuses (`dense`, `bm25`, `splade`), each with its weight in the min-max score "
        "fusion, above 0",
    ),
]


FIRST_STAGES = (
    "`dense`, `bm25`, `splade` (a store with a `sparse_model`), or `hybrid` (the stages its weights name fused; "
    "default dense and BM25)"
)


class CreateVectorStoreRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """OpenAI's body, and how the store searches (extensions)."""

    name: Annotated[str, Meta(max_length=256, pattern=NO_NUL)] | None = None
    description: Annotated[str, Meta(max_length=512, pattern=NO_NUL)] | None = None
    file_ids: Annotated[list[str], Meta(max_length=500)] = msgspec.field(default_factory=list)
    expires_after: ExpiresAfter | None = None
    chunking_strategy: ChunkingStrategy | None = None
    metadata: Metadata | None = None
    model: Annotated[
        str | None, Meta(description="extension: the served embedding model that embeds the store (default: the first)")
    ] = None
    sparse_model: Annotated[
        str | None,
        Meta(
            description="extension: a served SPLADE model (or bge-m3) that also embeds the store's chunks as sparse "
            "vectors, for the `splade` stage (default: none; the first served one when `first_stage` or "
            "`hybrid_weights` asks for SPLADE)"
        ),
    ] = None
    adapter: Annotated[
        Annotated[str, Meta(min_length=1)] | None,
        Meta(
            description="extension: the LoRA adapter of `model` that embeds the store's chunks and its queries (GET "
            "/v1/models lists each model's); default: the retrieval adapters of a model that has them "
            "(`retrieval.passage` for chunks, `retrieval.query` for queries), else the base model"
        ),
    ] = None
    first_stage: Annotated[
        Literal["dense", "bm25", "splade", "hybrid"],
        Meta(description=f"extension: the first stage of its searches: {FIRST_STAGES}"),
    ] = "dense"
    hybrid_weight: Annotated[
        float,
        Meta(
            ge=0,
            le=1,
            description="extension: the dense stage's weight in a hybrid of dense and BM25 (min-max score fusion); "
            "BM25 weighs the rest",
        ),
    ] = 0.5
    hybrid_weights: Annotated[
        HybridWeights | None,
        Meta(
            description="extension: the stages a hybrid fuses and their weights, instead of `hybrid_weight`: "
            '`{"dense": 0.5, "bm25": 0.3, "splade": 0.2}`'
        ),
    ] = None
    index: Annotated[
        StoreIndexKind,
        Meta(
            description="extension: the dense stage's index: `auto` (exact below 1,000,000 chunks, HNSW above), `flat` "
            "(exact), `hnsw`, `ivf`, `pq`, or `binary` (1-bit codes rescored with int8); a filtered search is exact"
        ),
    ] = "auto"


class UpdateVectorStoreRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[str, Meta(max_length=256, pattern=NO_NUL)] | UnsetType | None = UNSET
    expires_after: ExpiresAfter | UnsetType | None = UNSET
    metadata: Metadata | UnsetType | None = UNSET


class FileInBatch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    file_id: Annotated[str, Meta(min_length=1)]
    attributes: FileAttributes | None = None
    chunking_strategy: ChunkingStrategy | None = None


class CreateFileRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    file_id: Annotated[str, Meta(min_length=1)]
    attributes: FileAttributes | None = None
    chunking_strategy: ChunkingStrategy | None = None


class UpdateFileRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    attributes: Annotated[FileAttributes | None, Meta(description="the file's new attributes; null clears them")] = None


class CreateFileBatchRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    file_ids: Annotated[list[str], Meta(max_length=500)] | None = None
    files: Annotated[list[FileInBatch], Meta(max_length=500)] | None = None
    attributes: FileAttributes | None = None
    chunking_strategy: ChunkingStrategy | None = None


class HybridSearch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """OpenAI's ``ranking_options.hybrid_search``: how much the semantic and the keyword matches weigh."""

    embedding_weight: Annotated[float, Meta(ge=0, description="the dense stage's weight")]
    text_weight: Annotated[float, Meta(ge=0, description="the BM25 stage's weight")]

    def weights(self) -> dict[Stage, float]:
        """The hybrid's weights, each stage's share of their sum (a stage weighed 0 is left out).

        >>> HybridSearch(embedding_weight=3, text_weight=1).weights()
        {'dense': 0.75, 'bm25': 0.25}
        """
        total = self.embedding_weight + self.text_weight
        shares: dict[Stage, float] = {"dense": self.embedding_weight / total, "bm25": self.text_weight / total}
        return {stage: share for stage, share in shares.items() if share > 0}


class RankingOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    ranker: Annotated[
        str,
        Meta(
            min_length=1,
            description="`none` (the first stage's order), `auto` or `default-2024-11-15` (the first served reranker, "
            "none if there is none), or the id of a served reranker",
        ),
    ] = "auto"
    score_threshold: Annotated[
        float,
        Meta(
            description="results scored below it are dropped; the score is the ranker's (a reranker's, or the first "
            "stage's: a cosine, a BM25 score, a fused score), so it may pass 1"
        ),
    ] = 0.0
    hybrid_search: Annotated[
        HybridSearch | None,
        Meta(
            description="a hybrid of the dense stage and BM25 weighed as given (their shares of the sum), for this "
            "search (sent by gateways forwarding OpenAI's file_search tool); the extensions `hybrid_weight(s)` win"
        ),
    ] = None


Query = Annotated[str, Meta(min_length=1, pattern=NOT_BLANK)]


class SearchRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    query: Query | Annotated[list[Query], Meta(min_length=1, max_length=10)]
    filters: Annotated[dict[str, Any] | None, Meta(description="a comparison or compound filter on attributes")] = None
    max_num_results: Annotated[int, Meta(ge=1, le=50)] = 10
    ranking_options: RankingOptions | None = None
    rewrite_query: Annotated[
        bool, Meta(description="accepted; queries are searched as sent (`search_query` in the answer says so)")
    ] = False
    rerank_candidates: Annotated[
        int, Meta(ge=1, le=1000, description="extension: first-stage results a ranker rescores")
    ] = 50
    first_stage: Annotated[
        Literal["dense", "bm25", "splade", "hybrid"] | None,
        Meta(description="extension: this search's first stage instead of the store's"),
    ] = None
    hybrid_weight: Annotated[
        Annotated[float, Meta(ge=0, le=1)] | None,
        Meta(description="extension: this search's dense weight in a hybrid of dense and BM25 instead of the store's"),
    ] = None
    hybrid_weights: Annotated[
        HybridWeights | None,
        Meta(description="extension: this search's hybrid weights instead of the store's"),
    ] = None


# -- answers ------------------------------------------------------------------------------------------
class ExpiresAfterObject(msgspec.Struct, kw_only=True):
    anchor: Literal["last_active_at"] = "last_active_at"
    days: int


class VectorStoreObject(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["vector_store"] = "vector_store"
    created_at: int
    name: str | None
    description: str | None
    usage_bytes: int
    file_counts: FileCounts
    status: Literal["expired", "in_progress", "completed"]
    expires_after: ExpiresAfterObject | None
    expires_at: int | None
    last_active_at: int | None
    metadata: dict[str, str] | None
    model: str
    sparse_model: str | None
    adapter: str | None = None
    first_stage: str
    hybrid_weight: float
    hybrid_weights: dict[Stage, float]
    index: str


class VectorStoreList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[VectorStoreObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class VectorStoreDeleted(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["vector_store.deleted"] = "vector_store.deleted"
    deleted: bool = True


class StaticObject(msgspec.Struct, kw_only=True):
    max_chunk_size_tokens: int
    chunk_overlap_tokens: int


class ChunkingObject(msgspec.Struct, kw_only=True):
    type: Literal["static"] = "static"
    static: StaticObject


class LastError(msgspec.Struct, kw_only=True):
    code: Literal["server_error", "unsupported_file", "invalid_file"]
    message: str


class VectorStoreFileObject(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["vector_store.file"] = "vector_store.file"
    created_at: int
    vector_store_id: str
    status: Literal["in_progress", "completed", "cancelled", "failed"]
    usage_bytes: int
    last_error: LastError | None
    attributes: dict[str, str | float | bool] | None
    chunking_strategy: ChunkingObject


class VectorStoreFileList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[VectorStoreFileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class VectorStoreFileDeleted(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["vector_store.file.deleted"] = "vector_store.file.deleted"
    deleted: bool = True


class FileBatchObject(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["vector_store.files_batch"] = "vector_store.files_batch"
    created_at: int
    vector_store_id: str
    status: Literal["in_progress", "completed", "cancelled", "failed"]
    file_counts: FileCounts


class TextContent(msgspec.Struct, kw_only=True):
    type: Literal["text"] = "text"
    text: str


class FileContentPage(msgspec.Struct, kw_only=True):
    object: Literal["vector_store.file_content.page"] = "vector_store.file_content.page"
    data: list[TextContent]
    has_more: bool = False
    next_page: str | None = None


class SearchResult(msgspec.Struct, kw_only=True):
    file_id: str
    filename: str
    score: float
    attributes: dict[str, str | float | bool] | None
    content: list[TextContent]


class SearchResultPage(msgspec.Struct, kw_only=True):
    object: Literal["vector_store.search_results.page"] = "vector_store.search_results.page"
    search_query: list[str]
    data: list[SearchResult]
    has_more: bool = False
    next_page: str | None = None
    ranker: Annotated[str, Meta(description="extension: the ranker that ordered the results (`none`, or its id)")]


def store_object(state: StoreState, now: int) -> VectorStoreObject:
    row = state.row
    if row.expired(now):
        status: Literal["expired", "in_progress", "completed"] = "expired"
    else:
        status = "in_progress" if state.counts.in_progress else "completed"
    return VectorStoreObject(
        id=row.id,
        created_at=row.created_at,
        name=row.name,
        description=row.description,
        usage_bytes=state.usage_bytes,
        file_counts=state.counts,
        status=status,
        expires_after=ExpiresAfterObject(days=row.expires_after_days) if row.expires_after_days else None,
        expires_at=row.expires_at,
        last_active_at=row.last_active_at,
        metadata=row.metadata,
        model=row.model,
        sparse_model=row.sparse_model,
        adapter=row.adapter,
        first_stage=row.first_stage,
        hybrid_weight=row.hybrid_weight,
        hybrid_weights=dict(hybrid_weights(row.hybrid_weight, row.hybrid_weights)),
        index=row.index_kind,
    )


def file_object(row: FileRow) -> VectorStoreFileObject:
    return VectorStoreFileObject(
        id=row.file_id,
        created_at=row.created_at,
        vector_store_id=row.vector_store_id,
        status=row.status,
        usage_bytes=row.usage_bytes,
        last_error=msgspec.convert(row.last_error, LastError) if row.last_error else None,
        attributes=row.attributes,
        chunking_strategy=ChunkingObject(
            static=StaticObject(max_chunk_size_tokens=row.chunk_size, chunk_overlap_tokens=row.chunk_overlap)
        ),
    )


def batch_object(row: BatchRow, counts: FileCounts) -> FileBatchObject:
    if row.cancelled_at is not None:
        status: Literal["in_progress", "completed", "cancelled", "failed"] = "cancelled"
    elif counts.in_progress:
        status = "in_progress"
    else:
        status = "failed" if counts.total and counts.failed == counts.total else "completed"
    return FileBatchObject(
        id=row.id, created_at=row.created_at, vector_store_id=row.vector_store_id, status=status, file_counts=counts
    )
