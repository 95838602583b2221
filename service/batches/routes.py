"""OpenAI's Files and Batch API over the batch store: ``/v1/files`` (upload, list, retrieve, content, delete)
and ``/v1/batches`` (create, retrieve, list, cancel), with OpenAI's objects (:mod:`service.batches.schemas`), so
the openai SDK works unchanged.

Every file and batch belongs to the API key that made it (the store keeps a digest of the key, never the key;
the auth layer puts it on the request, :func:`service.auth.owner_of`): another key gets 404, as for an object
that does not exist.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from litestar import Request, delete, get, post
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.openapi import ResponseSpec
from litestar.params import Parameter
from litestar.response import Stream

from service.auth import owner_of
from service.batches.schemas import (
    WINDOW_SECONDS,
    BatchList,
    BatchObject,
    CreateBatchRequest,
    FileDeleted,
    FileList,
    FileObject,
    batch_object,
    file_object,
)
from service.batches.service import BatchService
from service.batches.store import BatchStore
from service.errors import APIError, invalid
from service.handling import ERRORS, service_of
from service.schemas import PURPOSES, ErrorResponse

FILE_PATH = "/v1/files"
NOT_FOUND = {404: ResponseSpec(data_container=ErrorResponse, description="No such file or batch for this API key")}
UNAVAILABLE = {
    503: ResponseSpec(
        data_container=ErrorResponse,
        description="Service draining, or the Batch API's database cannot be reached now (code "
        "batch_database_unavailable); honour Retry-After",
    )
}
READ = {status: ERRORS[status] for status in (400, 401)} | NOT_FOUND | UNAVAILABLE  # what a GET may answer
IN_USE = {409: ResponseSpec(data_container=ErrorResponse, description="The file is the input of an unfinished batch")}
CANCEL = {status: ERRORS[status] for status in (400, 401, 415)} | NOT_FOUND


def _batches(state: State) -> BatchService:
    batches = service_of(state).batches
    assert batches is not None
    return batches


async def _store(state: State) -> BatchStore:
    """The batch store, opened in a worker thread the first time."""
    batches = _batches(state)
    opened = batches.opened
    return opened if opened is not None else await asyncio.to_thread(batches.store)


def list_page(rows: Sequence[Any], limit: int, key: str = "id") -> dict[str, Any]:
    """A list object's paging fields for the first ``limit`` of ``rows`` (asked for one more than the page), each
    row's id its attribute ``key``."""
    shown = rows[:limit]
    return {
        "first_id": getattr(shown[0], key) if shown else None,
        "last_id": getattr(shown[-1], key) if shown else None,
        "has_more": len(rows) > limit,
    }


def _not_found(what: str, object_id: str) -> APIError:
    return APIError(
        404, f"no {what} with id {object_id[:100]!r} for this API key", param=f"{what}_id", code="not_found"
    )


@post(
    FILE_PATH,
    summary="Upload a file",
    description="A file (multipart form: `file`, and `purpose`: `batch` for a batch's input, `assistants` or "
    "`user_data` for vector stores), as OpenAI's files API.",
    responses={**ERRORS, **UNAVAILABLE},
    status_code=200,
)
async def upload_file(request: Request[Any, Any, Any], state: State) -> FileObject:
    batches = _batches(state)
    limit = batches.settings.limits.max_file_bytes
    try:  # the body is bounded by max_file_bytes and the form's margin (service.app)
        form = await request.form()
    except HTTPException as exc:
        if exc.status_code != 413:
            raise
        raise APIError(413, f"the file is larger than max_file_bytes={limit}", code="file_too_large") from None
    except (UnicodeDecodeError, LookupError):  # a field that is not text in its charset, or a charset that is none
        raise invalid("a form field is not text in its declared charset (UTF-8 when none is declared)") from None
    purpose, upload = form.get("purpose"), form.get("file")
    if purpose not in PURPOSES:
        raise invalid(
            f"purpose must be one of {', '.join(map(repr, PURPOSES))}, got {str(purpose)[:50]!r}", param="purpose"
        )
    if upload is None or isinstance(upload, str):
        raise invalid("the form has no file part named 'file'", param="file", code="missing_field")
    filename = upload.filename or "input.jsonl"
    if any(ord(c) < 32 or ord(c) == 127 for c in filename):  # a NUL byte no database stores, a newline in a log
        raise invalid("the file's name holds a control character (a NUL byte, a newline)", param="file")
    content = await upload.read()
    if len(content) > limit:
        raise APIError(
            413, f"the file is {len(content)} bytes; the limit is max_file_bytes={limit}", code="file_too_large"
        )
    row = await asyncio.to_thread((await _store(state)).add_file, owner_of(request), filename[:255], purpose, content)
    return file_object(row)


@get(FILE_PATH, summary="List files", responses=READ)
async def list_files(
    request: Request[Any, Any, Any],
    state: State,
    purpose: str | None = None,
    after: str | None = None,
    limit: Annotated[int, Parameter(ge=1, le=10000)] = 10000,
    order: Literal["asc", "desc"] = "desc",
) -> FileList:
    store = await _store(state)
    rows = await asyncio.to_thread(
        store.list_files, owner_of(request), purpose=purpose, after=after, limit=limit + 1, order=order
    )
    return FileList(data=[file_object(r) for r in rows[:limit]], **list_page(rows, limit))


@get(FILE_PATH + "/{file_id:str}", summary="Retrieve a file", responses=READ)
async def retrieve_file(request: Request[Any, Any, Any], state: State, file_id: str) -> FileObject:
    row = await asyncio.to_thread((await _store(state)).get_file, owner_of(request), file_id)
    if row is None:
        raise _not_found("file", file_id)
    return file_object(row)


@get(
    FILE_PATH + "/{file_id:str}/content",
    summary="A file's content",
    media_type="application/octet-stream",
    responses=READ,
)
async def file_content(request: Request[Any, Any, Any], state: State, file_id: str) -> Stream:
    """The file's bytes, streamed from disk (an output file may be far larger than a response held in memory)."""
    store = await _store(state)
    row = await asyncio.to_thread(store.get_file, owner_of(request), file_id)
    if row is None:
        raise _not_found("file", file_id)
    return Stream(_chunks(store.file_path(file_id)), media_type="application/octet-stream")


def _chunks(path: Path, size: int = 1 << 20) -> Iterator[bytes]:
    """``path``'s bytes, a MiB at a time."""
    with open(path, "rb") as f:
        while chunk := f.read(size):
            yield chunk


@delete(FILE_PATH + "/{file_id:str}", summary="Delete a file", status_code=200, responses=READ | IN_USE)
async def delete_file(request: Request[Any, Any, Any], state: State, file_id: str) -> FileDeleted:
    deleted = await asyncio.to_thread((await _store(state)).delete_file, owner_of(request), file_id)
    if not deleted:
        raise _not_found("file", file_id)
    return FileDeleted(id=file_id, deleted=True)


@post(
    "/v1/batches",
    summary="Create a batch",
    description="Run every line of an uploaded input file as the request it holds, behind direct requests, into "
    "an output file and an error file, as OpenAI's Batch API.",
    responses={**ERRORS, **NOT_FOUND, **UNAVAILABLE},
    status_code=200,
)
async def create_batch(data: CreateBatchRequest, request: Request[Any, Any, Any], state: State) -> BatchObject:
    batches = _batches(state)
    seconds = WINDOW_SECONDS[data.completion_window]
    store, owner = await _store(state), owner_of(request)
    file = await asyncio.to_thread(store.get_file, owner, data.input_file_id)
    if file is None or file.purpose != "batch":
        raise _not_found("input_file", data.input_file_id)
    row = await asyncio.to_thread(
        store.create_batch,
        owner,
        endpoint=data.endpoint,
        input_file_id=data.input_file_id,
        completion_window=data.completion_window,
        window_seconds=seconds,
        metadata=data.metadata,
        max_active=batches.settings.limits.max_batches_in_flight,
    )
    if batches.worker is not None:
        batches.worker.wake()
    return batch_object(row)


@get("/v1/batches/{batch_id:str}", summary="Retrieve a batch", responses=READ)
async def retrieve_batch(request: Request[Any, Any, Any], state: State, batch_id: str) -> BatchObject:
    row = await asyncio.to_thread((await _store(state)).get_batch, owner_of(request), batch_id)
    if row is None:
        raise _not_found("batch", batch_id)
    return batch_object(row)


@get("/v1/batches", summary="List batches", responses=READ)
async def list_batches(
    request: Request[Any, Any, Any],
    state: State,
    after: str | None = None,
    limit: Annotated[int, Parameter(ge=1, le=100)] = 20,
) -> BatchList:
    rows = await asyncio.to_thread((await _store(state)).list_batches, owner_of(request), after=after, limit=limit + 1)
    return BatchList(data=[batch_object(r) for r in rows[:limit]], **list_page(rows, limit))


@post(
    "/v1/batches/{batch_id:str}/cancel",
    summary="Cancel a batch",
    status_code=200,
    responses=READ,
)
async def cancel_batch(request: Request[Any, Any, Any], state: State, batch_id: str) -> BatchObject:
    row = await asyncio.to_thread((await _store(state)).cancel, owner_of(request), batch_id)
    if row is None:
        raise _not_found("batch", batch_id)
    return batch_object(row)


HANDLERS = (
    upload_file,
    list_files,
    retrieve_file,
    file_content,
    delete_file,
    create_batch,
    retrieve_batch,
    list_batches,
    cancel_batch,
)
FILE_HANDLERS = (upload_file, list_files)
"""The handlers of ``/v1/files`` itself: the app mounts them on a router of their own, whose body limit is
``max_file_bytes`` (an upload is larger than a JSON body may be)."""
FORM_PATHS = frozenset({FILE_PATH})
"""Routes whose POST body is a multipart form, not JSON."""
