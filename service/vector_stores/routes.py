"""OpenAI's Vector Stores API: ``/v1/vector_stores`` (create, list, retrieve, modify, delete, search), their files
(attach a ``/v1/files`` upload, list, retrieve, update attributes, remove, content) and file batches (create,
retrieve, cancel, list files), with OpenAI's objects (:mod:`service.vector_stores.schemas`), so the openai SDK's
``client.vector_stores`` works unchanged.

Every store belongs to the API key that made it (as files and batches do): another key gets 404 on it, its files
and its searches. Files are read by a worker behind direct requests (:mod:`service.vector_stores.ingest`); a file
is searchable once ``completed``.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, delete, get, post
from litestar.datastructures import State
from litestar.openapi import ResponseSpec
from litestar.params import Parameter
from msgspec import UNSET

from embedrank.retrieval.documents import UnsupportedFileError, file_type
from service.auth import owner_of
from service.errors import NotFoundError, invalid
from service.handling import ERRORS, UNAVAILABLE
from service.schemas import ErrorResponse
from service.vector_stores.schemas import (
    ChunkingStrategy,
    CreateFileBatchRequest,
    CreateFileRequest,
    CreateVectorStoreRequest,
    FileBatchObject,
    FileContentPage,
    SearchRequest,
    SearchResult,
    SearchResultPage,
    TextContent,
    UpdateFileRequest,
    UpdateVectorStoreRequest,
    VectorStoreDeleted,
    VectorStoreFileDeleted,
    VectorStoreFileList,
    VectorStoreFileObject,
    VectorStoreList,
    VectorStoreObject,
    batch_object,
    file_object,
    store_object,
)
from service.vector_stores.service import vector_stores_of
from service.vector_stores.store import Attributes, FileRow, StoreRow, VectorStoreTables

PATH = "/v1/vector_stores"
STORE = PATH + "/{vector_store_id:str}"
NOT_FOUND = {404: ResponseSpec(data_container=ErrorResponse, description="No such vector store or file for this key")}
READ = {status: ERRORS[status] for status in (400, 401)} | NOT_FOUND | UNAVAILABLE
WRITE = {**ERRORS, **NOT_FOUND, **UNAVAILABLE}
ATTACHABLE = ("assistants", "user_data")
"""The purposes of an uploaded file a vector store reads."""
Order = Literal["asc", "desc"]
Limit = Annotated[int, Parameter(ge=1, le=100)]


async def _store(state: State, request: Request[Any, Any, Any], store_id: str) -> tuple[VectorStoreTables, StoreRow]:
    tables = await vector_stores_of(state).opened()
    row = await asyncio.to_thread(tables.get_store, owner_of(request), store_id)
    if row is None:
        raise NotFoundError("vector store", store_id)
    return tables, row


async def _live(tables: VectorStoreTables, store: StoreRow, doing: str) -> int:
    """The database's time, once it is known that ``store`` has not expired: an expired store (its chunks removed)
    is a 400 ``vector_store_expired`` for ``doing``."""
    now = await asyncio.to_thread(tables.now)
    if store.expired(now):
        raise invalid(
            f"vector store {store.id} has expired (its chunks are removed): it cannot {doing}; create a new one",
            param="vector_store_id",
            code="vector_store_expired",
        )
    return now


async def _object(tables: VectorStoreTables, row: StoreRow) -> VectorStoreObject:
    state, now = await asyncio.gather(asyncio.to_thread(tables.state, row), asyncio.to_thread(tables.now))
    return store_object(state, now)


async def _attach(
    state: State,
    request: Request[Any, Any, Any],
    store: StoreRow,
    files: list[tuple[str, Attributes | None, ChunkingStrategy | None]],
    *,
    batch: bool,
) -> tuple[list[FileRow], Any]:
    """Attach ``files`` (id, attributes, chunking) to ``store``: each must be an upload of this key with purpose
    ``assistants`` or ``user_data``; one of a type that is not read is recorded ``failed`` (``unsupported_file``)."""
    service = vector_stores_of(state)
    tables = await service.opened()
    await _live(tables, store, "take files")
    uploads = await service.files.opened()
    owner = owner_of(request)
    models = service.embedders(store)
    planned: dict[bytes, tuple[int, int]] = {}
    rows = []
    for file_id, attributes, strategy in files:
        upload = await asyncio.to_thread(uploads.get_file, owner, file_id)
        if upload is None:  # 400: the body names it; a 404 is for the path's store
            raise invalid(f"no file with id {file_id[:100]!r} for this API key", param="file_id", code="file_not_found")
        if upload.purpose not in ATTACHABLE:
            raise invalid(
                f"file {file_id} has purpose {upload.purpose!r}; a vector store reads files uploaded with purpose "
                f"{' or '.join(map(repr, ATTACHABLE))}",
                param="file_id",
            )
        if strategy is None:
            size, overlap = store.chunk_size, store.chunk_overlap
        else:  # a batch's files mostly share one strategy: each distinct one is checked once
            key = msgspec.json.encode(strategy)
            if key not in planned:
                planned[key] = await service.chunking(strategy, models)
            size, overlap = planned[key]
        error = None
        try:
            file_type(upload.filename)
        except UnsupportedFileError as exc:
            error = {"code": exc.code, "message": str(exc)}
        rows.append((file_id, upload.filename, attributes, size, overlap, error))
    made = await asyncio.to_thread(
        tables.attach, store, rows, max_files=service.settings.limits.max_vector_store_files, batch=batch
    )
    service.wake()
    return made


@post(
    PATH,
    summary="Create a vector store",
    description="A store of chunks searched by its embedding model (`model`, default the first served), its "
    "first stage (`dense`, `bm25`, `splade` with a SPLADE `sparse_model`, or `hybrid` with its weights), its dense "
    "`index` and a ranker at search; `file_ids` are attached at once.",
    responses=WRITE,
    status_code=200,
)
async def create_vector_store(
    data: CreateVectorStoreRequest, request: Request[Any, Any, Any], state: State
) -> VectorStoreObject:
    service = vector_stores_of(state)
    tables = await service.opened()
    models, weights = service.planned(data)
    size, overlap = await service.chunking(data.chunking_strategy, models)
    row = await asyncio.to_thread(
        tables.create_store,
        owner_of(request),
        name=data.name,
        description=data.description,
        metadata=data.metadata,
        model=models[0][0],
        sparse_model=models[1][0] if len(models) > 1 else None,
        adapter=data.adapter,
        first_stage=data.first_stage,
        hybrid_weight=data.hybrid_weight,
        hybrid_weights=weights,
        index_kind=data.index,
        chunk_size=size,
        chunk_overlap=overlap,
        expires_after_days=data.expires_after.days if data.expires_after else None,
        max_stores=service.settings.limits.max_vector_stores,
    )
    if data.file_ids:
        try:
            await _attach(state, request, row, [(f, None, None) for f in data.file_ids], batch=False)
        except Exception:  # a file that is not this key's: no store is left behind
            await asyncio.to_thread(tables.delete_store, row.owner, row.id)
            raise
    return await _object(tables, row)


@get(PATH, summary="List vector stores", responses=READ)
async def list_vector_stores(
    request: Request[Any, Any, Any],
    state: State,
    after: str | None = None,
    before: str | None = None,
    limit: Limit = 20,
    order: Order = "desc",
) -> VectorStoreList:
    tables = await vector_stores_of(state).opened()
    page = await asyncio.to_thread(
        tables.list_stores, owner_of(request), after=after, before=before, limit=limit, order=order
    )
    return VectorStoreList(data=[await _object(tables, r) for r in page.rows], **page.cursors())


@get(STORE, summary="Retrieve a vector store", responses=READ)
async def retrieve_vector_store(
    request: Request[Any, Any, Any], state: State, vector_store_id: str
) -> VectorStoreObject:
    tables, row = await _store(state, request, vector_store_id)
    return await _object(tables, row)


@post(STORE, summary="Modify a vector store", responses=WRITE, status_code=200)
async def modify_vector_store(
    data: UpdateVectorStoreRequest, request: Request[Any, Any, Any], state: State, vector_store_id: str
) -> VectorStoreObject:
    tables, store = await _store(state, request, vector_store_id)
    changes: dict[str, Any] = {}
    if data.name is not UNSET:
        changes["name"] = data.name
    if data.metadata is not UNSET:
        changes["metadata"] = data.metadata
    if data.expires_after is not UNSET:
        await _live(tables, store, "take a new expiration policy")
        changes["expires_after_days"] = data.expires_after.days if data.expires_after else None  # type: ignore[union-attr]
    row = await asyncio.to_thread(tables.update_store, owner_of(request), vector_store_id, changes)
    if row is None:
        raise NotFoundError("vector store", vector_store_id)
    return await _object(tables, row)


@delete(STORE, summary="Delete a vector store", status_code=200, responses=READ)
async def delete_vector_store(
    request: Request[Any, Any, Any], state: State, vector_store_id: str
) -> VectorStoreDeleted:
    service = vector_stores_of(state)
    tables = await service.opened()
    if not await asyncio.to_thread(tables.delete_store, owner_of(request), vector_store_id):
        raise NotFoundError("vector store", vector_store_id)
    service.recheck()
    await service.forget(vector_store_id)
    return VectorStoreDeleted(id=vector_store_id)


@post(
    STORE + "/search",
    summary="Search a vector store",
    description="The chunks that best answer `query`, by the store's first stage, filtered on attributes, "
    "ordered by a ranker (`ranking_options.ranker`: `none`, `auto`, or a served reranker's id).",
    responses=WRITE,
    status_code=200,
)
async def search_vector_store(
    data: SearchRequest, request: Request[Any, Any, Any], state: State, vector_store_id: str
) -> SearchResultPage:
    service = vector_stores_of(state)
    tables, store = await _store(state, request, vector_store_id)
    now = await _live(tables, store, "be searched")
    queries, ranker, results = await service.search(store, data)
    await asyncio.to_thread(tables.touch, store, now)
    return SearchResultPage(
        search_query=queries,
        ranker=ranker,
        data=[
            SearchResult(
                file_id=r["file_id"],
                filename=r["filename"],
                score=r["score"],
                attributes=r["attributes"],
                content=[TextContent(text=r["text"])],
            )
            for r in results
        ],
    )


# -- files ------------------------------------------------------------------------------------------
@post(STORE + "/files", summary="Attach a file to a vector store", responses=WRITE, status_code=200)
async def create_vector_store_file(
    data: CreateFileRequest, request: Request[Any, Any, Any], state: State, vector_store_id: str
) -> VectorStoreFileObject:
    _, store = await _store(state, request, vector_store_id)
    rows, _ = await _attach(
        state, request, store, [(data.file_id, data.attributes, data.chunking_strategy)], batch=False
    )
    return file_object(rows[0])


@get(STORE + "/files", summary="List a vector store's files", responses=READ)
async def list_vector_store_files(
    request: Request[Any, Any, Any],
    state: State,
    vector_store_id: str,
    after: str | None = None,
    before: str | None = None,
    limit: Limit = 20,
    order: Order = "desc",
    filter: Literal["in_progress", "completed", "failed", "cancelled"] | None = None,
) -> VectorStoreFileList:
    tables, store = await _store(state, request, vector_store_id)
    page = await asyncio.to_thread(
        tables.list_files, store, status=filter, after=after, before=before, limit=limit, order=order
    )
    return VectorStoreFileList(data=[file_object(r) for r in page.rows], **page.cursors("file_id"))


async def _file(
    state: State, request: Request[Any, Any, Any], store_id: str, file_id: str
) -> tuple[VectorStoreTables, StoreRow, FileRow]:
    tables, store = await _store(state, request, store_id)
    row = await asyncio.to_thread(tables.get_file, store, file_id)
    if row is None:
        raise NotFoundError("file", file_id)
    return tables, store, row


@get(STORE + "/files/{file_id:str}", summary="Retrieve a vector store's file", responses=READ)
async def retrieve_vector_store_file(
    request: Request[Any, Any, Any], state: State, vector_store_id: str, file_id: str
) -> VectorStoreFileObject:
    _, _, row = await _file(state, request, vector_store_id, file_id)
    return file_object(row)


@post(
    STORE + "/files/{file_id:str}", summary="Update a vector store file's attributes", responses=WRITE, status_code=200
)
async def update_vector_store_file(
    data: UpdateFileRequest, request: Request[Any, Any, Any], state: State, vector_store_id: str, file_id: str
) -> VectorStoreFileObject:
    tables, store = await _store(state, request, vector_store_id)
    row = await asyncio.to_thread(tables.update_attributes, store, file_id, data.attributes)
    if row is None:
        raise NotFoundError("file", file_id)
    return file_object(row)


@delete(STORE + "/files/{file_id:str}", summary="Remove a file from a vector store", status_code=200, responses=READ)
async def delete_vector_store_file(
    request: Request[Any, Any, Any], state: State, vector_store_id: str, file_id: str
) -> VectorStoreFileDeleted:
    tables, store = await _store(state, request, vector_store_id)
    if not await asyncio.to_thread(tables.remove_file, store, file_id):
        raise NotFoundError("file", file_id)
    vector_stores_of(state).recheck()
    return VectorStoreFileDeleted(id=file_id)


@get(STORE + "/files/{file_id:str}/content", summary="A vector store file's chunks", responses=READ)
async def vector_store_file_content(
    request: Request[Any, Any, Any], state: State, vector_store_id: str, file_id: str
) -> FileContentPage:
    tables, store, _ = await _file(state, request, vector_store_id, file_id)
    texts = await asyncio.to_thread(tables.file_chunks, store, file_id)
    return FileContentPage(data=[TextContent(text=t) for t in texts])


# -- file batches -----------------------------------------------------------------------------------
@post(STORE + "/file_batches", summary="Attach files to a vector store as a batch", responses=WRITE, status_code=200)
async def create_file_batch(
    data: CreateFileBatchRequest, request: Request[Any, Any, Any], state: State, vector_store_id: str
) -> FileBatchObject:
    tables, store = await _store(state, request, vector_store_id)
    files = [(f, data.attributes, data.chunking_strategy) for f in data.file_ids or ()]
    files += [(f.file_id, f.attributes, f.chunking_strategy or data.chunking_strategy) for f in data.files or ()]
    if not files:
        raise invalid("a file batch names at least one file: send file_ids or files", param="file_ids")
    _, batch = await _attach(state, request, store, files, batch=True)
    return batch_object(batch, await asyncio.to_thread(tables.batch_counts, batch))


async def _batch(state: State, request: Request[Any, Any, Any], store_id: str, batch_id: str) -> Any:
    tables, store = await _store(state, request, store_id)
    batch = await asyncio.to_thread(tables.get_batch, store, batch_id)
    if batch is None:
        raise NotFoundError("file batch", batch_id, "batch_id")
    return tables, store, batch


@get(STORE + "/file_batches/{batch_id:str}", summary="Retrieve a file batch", responses=READ)
async def retrieve_file_batch(
    request: Request[Any, Any, Any], state: State, vector_store_id: str, batch_id: str
) -> FileBatchObject:
    tables, _, batch = await _batch(state, request, vector_store_id, batch_id)
    return batch_object(batch, await asyncio.to_thread(tables.batch_counts, batch))


@post(STORE + "/file_batches/{batch_id:str}/cancel", summary="Cancel a file batch", responses=READ, status_code=200)
async def cancel_file_batch(
    request: Request[Any, Any, Any], state: State, vector_store_id: str, batch_id: str
) -> FileBatchObject:
    tables, store, _ = await _batch(state, request, vector_store_id, batch_id)
    batch = await asyncio.to_thread(tables.cancel_batch, store, batch_id)
    vector_stores_of(state).recheck()
    return batch_object(batch, await asyncio.to_thread(tables.batch_counts, batch))


@get(STORE + "/file_batches/{batch_id:str}/files", summary="List a file batch's files", responses=READ)
async def list_file_batch_files(
    request: Request[Any, Any, Any],
    state: State,
    vector_store_id: str,
    batch_id: str,
    after: str | None = None,
    before: str | None = None,
    limit: Limit = 20,
    order: Order = "desc",
    filter: Literal["in_progress", "completed", "failed", "cancelled"] | None = None,
) -> VectorStoreFileList:
    tables, store, batch = await _batch(state, request, vector_store_id, batch_id)
    page = await asyncio.to_thread(
        tables.list_files,
        store,
        status=filter,
        batch_id=batch.id,
        after=after,
        before=before,
        limit=limit,
        order=order,
    )
    return VectorStoreFileList(data=[file_object(r) for r in page.rows], **page.cursors("file_id"))


HANDLERS = (
    create_vector_store,
    list_vector_stores,
    retrieve_vector_store,
    modify_vector_store,
    delete_vector_store,
    search_vector_store,
    create_vector_store_file,
    list_vector_store_files,
    retrieve_vector_store_file,
    update_vector_store_file,
    delete_vector_store_file,
    vector_store_file_content,
    create_file_batch,
    retrieve_file_batch,
    cancel_file_batch,
    list_file_batch_files,
)
