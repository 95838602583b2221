"""OpenAI's Files API over the storage: ``/v1/files`` (upload, list, retrieve, content, delete), with OpenAI's
file objects (:mod:`service.files.schemas`), so the openai SDK works unchanged.

Every file belongs to the API key that uploaded it (the store keeps a digest of the key, never the key; the auth
layer puts it on the request, :func:`service.auth.owner_of`): another key gets 404, as for a file that does not
exist.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from litestar import Request, delete, get, post
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.openapi import ResponseSpec
from litestar.params import Parameter
from litestar.response import Stream

from service.auth import owner_of
from service.errors import APIError, NotFoundError, invalid
from service.files.schemas import FileDeleted, FileList, FileObject, file_object
from service.files.service import files_of
from service.handling import ERRORS, UNAVAILABLE
from service.schemas import PURPOSES, ErrorResponse

FILE_PATH = "/v1/files"
NOT_FOUND = {404: ResponseSpec(data_container=ErrorResponse, description="No such file for this API key")}
READ = {status: ERRORS[status] for status in (400, 401)} | NOT_FOUND | UNAVAILABLE  # what a GET may answer
IN_USE = {409: ResponseSpec(data_container=ErrorResponse, description="The file is the input of an unfinished batch")}


@post(
    FILE_PATH,
    summary="Upload a file",
    description="A file (multipart form: `file`, and `purpose`: `batch` for a batch's input, `assistants` or "
    "`user_data` for vector stores), as OpenAI's files API.",
    responses={**ERRORS, **UNAVAILABLE},
    status_code=200,
)
async def upload_file(request: Request[Any, Any, Any], state: State) -> FileObject:
    files = files_of(state)
    limit = files.settings.limits.max_file_bytes
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
    store = await files.opened()
    row = await asyncio.to_thread(
        store.add_file,
        owner_of(request),
        filename[:255],
        purpose,
        content,
        max_owner_bytes=files.settings.limits.max_file_storage_per_key,
    )
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
    store = await files_of(state).opened()
    page = await asyncio.to_thread(
        store.list_files, owner_of(request), purpose=purpose, after=after, limit=limit, order=order
    )
    return FileList(data=[file_object(r) for r in page.rows], **page.cursors())


@get(FILE_PATH + "/{file_id:str}", summary="Retrieve a file", responses=READ)
async def retrieve_file(request: Request[Any, Any, Any], state: State, file_id: str) -> FileObject:
    row = await asyncio.to_thread((await files_of(state).opened()).get_file, owner_of(request), file_id)
    if row is None:
        raise NotFoundError("file", file_id)
    return file_object(row)


@get(
    FILE_PATH + "/{file_id:str}/content",
    summary="A file's content",
    media_type="application/octet-stream",
    responses=READ,
)
async def file_content(request: Request[Any, Any, Any], state: State, file_id: str) -> Stream:
    """The file's bytes, streamed from disk (an output file may be far larger than a response held in memory)."""
    store = await files_of(state).opened()
    row = await asyncio.to_thread(store.get_file, owner_of(request), file_id)
    if row is None:
        raise NotFoundError("file", file_id)
    return Stream(_chunks(store.file_path(file_id)), media_type="application/octet-stream")


def _chunks(path: Path, size: int = 1 << 20) -> Iterator[bytes]:
    """``path``'s bytes, a MiB at a time."""
    with open(path, "rb") as f:
        while chunk := f.read(size):
            yield chunk


@delete(FILE_PATH + "/{file_id:str}", summary="Delete a file", status_code=200, responses=READ | IN_USE)
async def delete_file(request: Request[Any, Any, Any], state: State, file_id: str) -> FileDeleted:
    deleted = await asyncio.to_thread((await files_of(state).opened()).delete_file, owner_of(request), file_id)
    if not deleted:
        raise NotFoundError("file", file_id)
    return FileDeleted(id=file_id, deleted=True)


HANDLERS = (upload_file, list_files, retrieve_file, file_content, delete_file)
FILE_HANDLERS = (upload_file, list_files)
"""The handlers of ``/v1/files`` itself: the app mounts them on a router of their own, whose body limit is
``max_file_bytes`` (an upload is larger than a JSON body may be)."""
FORM_PATHS = frozenset({FILE_PATH})
"""Routes whose POST body is a multipart form, not JSON."""
