"""OpenAI's Batch API objects as the service sends and reads them (msgspec), and a batch's row as one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import msgspec
from msgspec import Meta

from service.batches.store import BatchRow
from service.endpoints import BATCH_URLS
from service.schemas import Metadata

WINDOW_SECONDS = {"24h": 86_400}
"""The completion windows a batch may have, as OpenAI's API takes them (``24h`` only), and their length."""
if TYPE_CHECKING:
    BatchUrl = str
else:  # the urls of the endpoint table that batch lines may name, as one literal (its values in the OpenAPI schema)
    BatchUrl = Literal[BATCH_URLS]


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
        Literal["24h"],
        Meta(
            description="how long the batch may take: `24h`, as OpenAI; what has not run by then is reported as expired"
        ),
    ] = "24h"
    metadata: Metadata | None = None


def batch_object(row: BatchRow) -> BatchObject:
    return BatchObject(
        id=row.id,
        endpoint=row.endpoint,
        errors=BatchErrors(data=[BatchError(**e) for e in row.errors]) if row.errors else None,
        input_file_id=row.input_file_id,
        completion_window=row.completion_window,
        status=row.status,
        output_file_id=row.output_file_id,
        error_file_id=row.error_file_id,
        created_at=row.created_at,
        in_progress_at=row.in_progress_at,
        expires_at=row.expires_at,
        finalizing_at=row.finalizing_at,
        completed_at=row.completed_at,
        failed_at=row.failed_at,
        expired_at=row.expired_at,
        cancelling_at=row.cancelling_at,
        cancelled_at=row.cancelled_at,
        request_counts=RequestCounts(total=row.total, completed=row.completed, failed=row.failed),
        metadata=row.metadata,
    )
