"""OpenAI's Files and Batch API over the batch store: ``/v1/files`` (upload, list, retrieve, content, delete)
and ``/v1/batches`` (create, retrieve, list, cancel), with OpenAI's objects, so the openai SDK works unchanged.

Every file and batch belongs to the API key that made it (the store keeps a digest of the key, never the key):
another key gets 404, as for an object that does not exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
from litestar import Request, delete, get, post
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.openapi import ResponseSpec
from litestar.params import Parameter
from litestar.response import Stream
from msgspec import Meta
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from embedrank.serving.pool import ModelPool
from service.batches.database import DatabaseUnavailableError, PostgresDatabase
from service.batches.store import ACTIVE, BatchStore, FileInUseError, TooManyBatchesError
from service.batches.worker import RETRY_SECONDS, BatchWorker
from service.endpoints import BATCH_URLS
from service.errors import APIError, invalid
from service.handling import ERRORS, service_of
from service.schemas import ErrorResponse
from service.settings import Settings

logger = logging.getLogger("embedrank.service")

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
# 1 to 9999 minutes, or 1 to 999 hours, and nothing after ("$" would let a final newline through, in Python's
# regular expressions and in JSON Schema's)
WINDOW = r"^([1-9][0-9]{0,3}m|[1-9][0-9]{0,2}h)(?![\s\S])"
if TYPE_CHECKING:
    BatchUrl = str
else:  # the urls of the endpoint table that batch lines may name, as one literal (its values in the OpenAPI schema)
    BatchUrl = Literal[BATCH_URLS]

Metadata = Annotated[
    dict[Annotated[str, Meta(max_length=64)], Annotated[str, Meta(max_length=512)]],
    Meta(max_length=16, description="up to 16 keys of 64 characters, values of 512 characters"),
]


class FileObject(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


class RequestCounts(msgspec.Struct, kw_only=True):
    total: int
    completed: int
    failed: int


class BatchError(msgspec.Struct, kw_only=True):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[BatchError]


class BatchObject(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None


class BatchList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class CreateBatchRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """OpenAI's batch creation body."""

    input_file_id: Annotated[str, Meta(min_length=1, description="a file uploaded with purpose `batch`")]
    endpoint: Annotated[BatchUrl, Meta(description="the url of every line of the input file")]
    completion_window: Annotated[
        str,
        Meta(
            pattern=WINDOW,
            description="how long the batch may take: `24h` as OpenAI, or minutes or hours (`90m`, `48h`); "
            "what has not run by then is reported as expired",
        ),
    ] = "24h"
    metadata: Metadata | None = None


@dataclasses.dataclass(eq=False)  # a collector of the app's metrics registry: hashed by identity
class BatchService:
    """The batch store of ``settings.batch_dir`` (opened on first use) and the worker that runs its batches."""

    settings: Settings
    pool_of: Callable[[], ModelPool]
    _store: BatchStore | None = None
    worker: BatchWorker | None = None
    _opening: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @property
    def opened(self) -> BatchStore | None:
        """The store if it is open, else None (:meth:`store` opens it)."""
        return self._store

    @property
    def root(self) -> Path:
        return self.settings.batch_folder()

    def store(self) -> BatchStore:
        """The store, opened on first use (blocking: a PostgreSQL server is reached over the network).

        Raises:
            DatabaseUnavailableError: the database cannot be reached now.
        """
        with self._opening:
            if self._store is None:
                url = self.settings.batch_database
                self._store = BatchStore(self.root, PostgresDatabase(url) if url else None)
        return self._store

    async def run(self) -> None:
        """The worker, once the store exists (SQLite's is created by the first upload; a PostgreSQL server
        is reached at start, and again every few seconds until it answers); until cancelled."""
        while not self.settings.batch_database and self._store is None and not (self.root / "batches.db").is_file():
            await asyncio.sleep(0.5)
        while True:
            try:
                store = await asyncio.to_thread(self.store)
                break
            except Exception as exc:  # the server is not reachable (yet): the API answers 503 meanwhile
                logger.warning(
                    "the Batch API's database is not reachable: %s; trying again in %.0f s", exc, RETRY_SECONDS
                )
                await asyncio.sleep(RETRY_SECONDS)
        if not store.db.shared:  # one host on its own store: a claim left by a crash cannot be live
            await asyncio.to_thread(store.release_claims)
        for folder in await asyncio.to_thread(store.leftover_parts):  # a crash between closing and cleaning up
            await asyncio.to_thread(shutil.rmtree, folder, True)
        self.worker = BatchWorker(
            store,
            self.pool_of,
            self.settings,
            max_lines=self.settings.limits.max_batch_lines,
            lease_seconds=self.settings.batch_lease_seconds,
        )
        await self.worker.run()

    def collect(self) -> Iterator[Metric]:
        """The batches' progress for ``/metrics``, read from the store at each scrape: the unfinished batches,
        their lines waiting (the queue depth) and done, and the lines this process recorded. Summed over
        every key's batches: any key may read ``/metrics``, so batch ids appear (one series per batch) only
        when ``metrics_batch_ids`` is set."""
        by_batch = self.settings.metrics_batch_ids
        labels = ["batch"] if by_batch else []
        unfinished = GaugeMetricFamily("embedrank_batches_unfinished", "Batches not finished (every key's)")
        waiting = GaugeMetricFamily(
            "embedrank_batch_lines_waiting", "Lines of unfinished batches not yet recorded", labels=labels
        )
        done = GaugeMetricFamily(
            "embedrank_batch_lines_done",
            "Lines of unfinished batches recorded, by outcome",
            labels=[*labels, "outcome"],
        )
        recorded = CounterMetricFamily(
            "embedrank_batch_lines_recorded", "Batch lines this process has recorded (rate: lines per second)"
        )
        recorded.add_metric([], self.worker.lines_done if self.worker is not None else 0)
        orphans = CounterMetricFamily(
            "embedrank_batch_orphans_removed",
            "Files without a row, and file rows without a file, this process removed from the Batch API's store",
        )
        orphans.add_metric([], self.worker.orphans_removed if self.worker is not None else 0)
        rows: list[dict[str, Any]] = []
        if self._store is not None:
            try:
                rows = self._store.batches_in(*ACTIVE)
            except DatabaseUnavailableError as exc:  # the scrape still answers, without the batches' rows
                logger.warning("/metrics: the Batch API's database: %s", exc)
        unfinished.add_metric([], len(rows))
        if by_batch:
            for row in rows:
                waiting.add_metric([row["id"]], row["total"] - row["completed"] - row["failed"])
                done.add_metric([row["id"], "completed"], row["completed"])
                done.add_metric([row["id"], "failed"], row["failed"])
        else:
            waiting.add_metric([], sum(row["total"] - row["completed"] - row["failed"] for row in rows))
            done.add_metric(["completed"], sum(row["completed"] for row in rows))
            done.add_metric(["failed"], sum(row["failed"] for row in rows))
        full = GaugeMetricFamily(
            "embedrank_batch_store_full_seconds",
            "How long the Batch API's store has been out of disk space, batches waiting (0: it has room)",
        )
        since = self.worker.room_wanted_since if self.worker is not None else None
        full.add_metric([], time.time() - since if since is not None else 0.0)
        yield from (unfinished, waiting, done, recorded, orphans, full)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        task = asyncio.create_task(self.run())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def owner_of(request: Request[Any, Any, Any]) -> str:
    """Who a request acts for: a digest of its API key (``anonymous`` when authentication is off)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return "anonymous"
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def _batches(state: State) -> BatchService:
    batches = service_of(state).batches
    assert batches is not None
    return batches


async def _store(state: State) -> BatchStore:
    """The batch store, opened in a worker thread the first time."""
    batches = _batches(state)
    opened = batches.opened
    return opened if opened is not None else await asyncio.to_thread(batches.store)


def file_object(row: dict[str, Any]) -> FileObject:
    return FileObject(
        id=row["id"],
        bytes=row["bytes"],
        created_at=row["created_at"],
        filename=row["filename"],
        purpose=row["purpose"],
        expires_at=row["expires_at"],
    )


def batch_object(row: dict[str, Any]) -> BatchObject:
    errors = json.loads(row["errors"]) if row["errors"] else None
    return BatchObject(
        id=row["id"],
        endpoint=row["endpoint"],
        errors=BatchErrors(data=[BatchError(**e) for e in errors]) if errors else None,
        input_file_id=row["input_file_id"],
        completion_window=row["completion_window"],
        status=row["status"],
        output_file_id=row["output_file_id"],
        error_file_id=row["error_file_id"],
        created_at=row["created_at"],
        in_progress_at=row["in_progress_at"],
        expires_at=row["expires_at"],
        finalizing_at=row["finalizing_at"],
        completed_at=row["completed_at"],
        failed_at=row["failed_at"],
        expired_at=row["expired_at"],
        cancelling_at=row["cancelling_at"],
        cancelled_at=row["cancelled_at"],
        request_counts=RequestCounts(total=row["total"], completed=row["completed"], failed=row["failed"]),
        metadata=json.loads(row["metadata"]) if row["metadata"] else None,
    )


def _page(rows: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """A list object's paging fields for the first ``limit`` of ``rows`` (asked for one more than the page)."""
    shown = rows[:limit]
    return {
        "first_id": shown[0]["id"] if shown else None,
        "last_id": shown[-1]["id"] if shown else None,
        "has_more": len(rows) > limit,
    }


def _not_found(what: str, object_id: str) -> APIError:
    return APIError(
        404, f"no {what} with id {object_id[:100]!r} for this API key", param=f"{what}_id", code="not_found"
    )


@post(
    FILE_PATH,
    summary="Upload a file",
    description="A batch input file (multipart form: `file`, and `purpose` = `batch`), as OpenAI's files API.",
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
    if purpose != "batch":
        raise invalid(f"purpose must be 'batch', got {str(purpose)[:50]!r}", param="purpose")
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
    row = await asyncio.to_thread((await _store(state)).add_file, owner_of(request), filename[:255], "batch", content)
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
    return FileList(data=[file_object(r) for r in rows[:limit]], **_page(rows, limit))


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
    try:
        deleted = await asyncio.to_thread((await _store(state)).delete_file, owner_of(request), file_id)
    except FileInUseError as exc:
        raise APIError(409, f"{exc}; cancel it or wait for it to finish", param="file_id", code="file_in_use") from None
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
    seconds = int(data.completion_window[:-1]) * (60 if data.completion_window.endswith("m") else 3600)
    store, owner = await _store(state), owner_of(request)
    file = await asyncio.to_thread(store.get_file, owner, data.input_file_id)
    if file is None or file["purpose"] != "batch":
        raise _not_found("input_file", data.input_file_id)
    try:
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
    except TooManyBatchesError as exc:
        raise APIError(
            429,
            f"this API key has {exc.limit} unfinished batches, the limit (max_batches_in_flight); "
            "wait for one to finish",
            type="rate_limit_error",
            code="too_many_batches",
        ) from exc
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
    return BatchList(data=[batch_object(r) for r in rows[:limit]], **_page(rows, limit))


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
