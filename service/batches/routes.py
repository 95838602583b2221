"""OpenAI's Batch API over the batch store: ``/v1/batches`` (create, retrieve, list, cancel), with OpenAI's
objects (:mod:`service.batches.schemas`), so the openai SDK works unchanged; its files are the Files API's
(:mod:`service.files.routes`).

Every batch belongs to the API key that made it (the store keeps a digest of the key, never the key;
the auth layer puts it on the request, :func:`service.auth.owner_of`): another key gets 404, as for an object
that does not exist.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from litestar import Request, get, post
from litestar.datastructures import State
from litestar.openapi import ResponseSpec
from litestar.params import Parameter

from service.auth import owner_of
from service.batches.schemas import WINDOW_SECONDS, BatchList, BatchObject, CreateBatchRequest, batch_object
from service.batches.service import batches_of
from service.errors import NotFoundError
from service.handling import ERRORS, UNAVAILABLE
from service.schemas import ErrorResponse

NOT_FOUND = {404: ResponseSpec(data_container=ErrorResponse, description="No such file or batch for this API key")}
READ = {status: ERRORS[status] for status in (400, 401)} | NOT_FOUND | UNAVAILABLE  # what a GET may answer


@post(
    "/v1/batches",
    summary="Create a batch",
    description="Run every line of an uploaded input file as the request it holds, behind direct requests, into "
    "an output file and an error file, as OpenAI's Batch API.",
    responses={**ERRORS, **NOT_FOUND, **UNAVAILABLE},
    status_code=200,
)
async def create_batch(data: CreateBatchRequest, request: Request[Any, Any, Any], state: State) -> BatchObject:
    batches = batches_of(state)
    seconds = WINDOW_SECONDS[data.completion_window]
    store, owner = await batches.opened(), owner_of(request)
    file = await asyncio.to_thread(store.files.get_file, owner, data.input_file_id)
    if file is None or file.purpose != "batch":
        raise NotFoundError("input_file", data.input_file_id)
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
    row = await asyncio.to_thread((await batches_of(state).opened()).get_batch, owner_of(request), batch_id)
    if row is None:
        raise NotFoundError("batch", batch_id)
    return batch_object(row)


@get("/v1/batches", summary="List batches", responses=READ)
async def list_batches(
    request: Request[Any, Any, Any],
    state: State,
    after: str | None = None,
    limit: Annotated[int, Parameter(ge=1, le=100)] = 20,
) -> BatchList:
    store = await batches_of(state).opened()
    page = await asyncio.to_thread(store.list_batches, owner_of(request), after=after, limit=limit)
    return BatchList(data=[batch_object(r) for r in page.rows], **page.cursors())


@post(
    "/v1/batches/{batch_id:str}/cancel",
    summary="Cancel a batch",
    status_code=200,
    responses=READ,
)
async def cancel_batch(request: Request[Any, Any, Any], state: State, batch_id: str) -> BatchObject:
    row = await asyncio.to_thread((await batches_of(state).opened()).cancel, owner_of(request), batch_id)
    if row is None:
        raise NotFoundError("batch", batch_id)
    return batch_object(row)


HANDLERS = (create_batch, retrieve_batch, list_batches, cancel_batch)
