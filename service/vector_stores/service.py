"""Vector stores' lifecycle and calls: their tables (opened in the service's storage on first use), the worker
that reads attached files, this replica's search indexes, and a search from query to ranked chunks (in a front
process, the chunks are found by the engine process, which holds the indexes: :data:`SEARCH_CALL`)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import threading
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
from litestar.datastructures import State
from prometheus_client.core import GaugeMetricFamily, Metric

from embedrank.errors import InputTooLongError, NotReadyError, shorten
from embedrank.retrieval.filters import Filter, parse_filter
from embedrank.retrieval.store import FirstStageName, Stage, hybrid_weights
from embedrank.serving.chunking import window_of
from embedrank.serving.hosting import HostedModel
from embedrank.serving.options import EmbedOptions, RerankOptions
from embedrank.serving.pool import ModelPool
from embedrank.serving.remote import EngineFailedError, EngineHost, EngineLink
from embedrank.types import Chunking
from service.errors import invalid
from service.files.service import FileService
from service.schemas import blank
from service.settings import Settings
from service.storage.database import Connection
from service.storage.service import RETRY_SECONDS, StorageService
from service.vector_stores.ingest import Ingestor, scratch_folder
from service.vector_stores.schemas import (
    AUTO_CHUNK,
    ChunkingStrategy,
    CreateVectorStoreRequest,
    SearchRequest,
    StaticChunking,
)
from service.vector_stores.search import IndexCache, SearchCall, SearchThreads, chunk_results
from service.vector_stores.store import SCHEMA, StoreRow, VectorStoreTables, drop_file, listed_batches

logger = logging.getLogger("embedrank.service")

NO_RANKER = "none"
EXPIRY_SWEEP_SECONDS = 600.0
"""How often a replica empties the stores that have expired (when it starts, then this often)."""
AUTO_RANKERS = ("auto", "default-2024-11-15")
# what a replica's front asks of its engine process (:meth:`VectorStoreService.answer_fronts`)
SEARCH_CALL = "vector_store_search"  # a search (a SearchCall): the chunks found, as results' fields
FORGET_CALL = "vector_store_forget"  # stores deleted: drop their indexes, held and saved
WAKE_CALL = "vector_store_wake"  # files attached: the file reader claims them now
RECHECK_CALL = "vector_store_recheck"  # files removed, stores deleted: reads of files that left in_progress stop


@dataclasses.dataclass(frozen=True)
class AttachedFiles:
    """The vector stores as users of the file store (:class:`~service.files.store.FileUser`): a file may be
    deleted while attached, and leaves every store it is attached to (its chunks never found again, its store's
    counts without it), as OpenAI's ``files.delete`` does; a read of it in progress is stopped."""

    stores: VectorStoreService

    def holding(self, db: Connection, owner: str, file_id: str) -> str | None:
        return None

    def removing(self, db: Connection, owner: str, file_id: str) -> None:
        drop_file(db, owner, file_id)

    def removed(self, owner: str, file_id: str) -> None:
        self.stores.recheck_from_thread()


@dataclasses.dataclass(eq=False)
class VectorStoreService:
    """The vector stores of ``storage`` (their tables opened on first use), reading the uploads of ``files`` with
    the models of ``pool_of``; with an ``engine_link`` (a replica's front process), searched by the engine process
    (:meth:`answer_search` there)."""

    storage: StorageService
    files: FileService
    pool_of: Callable[[], ModelPool]
    engine_link: EngineLink | None = None
    _tables: VectorStoreTables | None = None
    indexes: IndexCache | None = None
    ingestor: Ingestor | None = None
    searches: SearchThreads | None = None  # the threads searches run in, shared fairly between keys
    _opening: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    _loop: asyncio.AbstractEventLoop | None = None
    _telling: set[asyncio.Task[Any]] = dataclasses.field(default_factory=set)

    def __post_init__(self) -> None:
        self.storage.register(SCHEMA, listed_batches)
        self.files.users.append(AttachedFiles(self))  # a deleted file leaves every store it is attached to

    @property
    def settings(self) -> Settings:
        return self.storage.settings

    def tables(self) -> VectorStoreTables:
        """The tables, created on first use (blocking)."""
        with self._opening:
            if self._tables is None:
                storage = self.storage.open()
                self._tables = VectorStoreTables(storage)
                self.indexes = IndexCache(self._tables, folder=storage.folder("vector_stores"))
        return self._tables

    async def opened(self) -> VectorStoreTables:
        return self._tables if self._tables is not None else await asyncio.to_thread(self.tables)

    async def run(self, cpus: int, *, searches: bool = True, files: bool = True) -> None:
        """The search threads (as many as the ``cpus`` the process may use), and the file reader once the storage
        exists (:meth:`StorageService.reached`); until cancelled. A replica's engine process runs both, for every
        front; its front processes neither (:mod:`service.replica`)."""
        self._loop = asyncio.get_running_loop()
        if searches:
            self.searches = SearchThreads(self.settings.limits.max_searches_per_key, cpus)  # before any request
        try:
            if files:
                await self._read_files()
            else:
                await asyncio.Event().wait()  # until cancelled
        finally:
            if self.searches is not None:
                self.searches.close()

    async def _read_files(self) -> None:
        storage = await self.storage.reached()
        while True:
            try:
                tables = await self.opened()
                uploads = await self.files.opened()
                break
            except Exception as exc:  # the server went away between the two: the API answers 503 meanwhile
                logger.warning("vector stores: the database is not reachable: %s; trying again", exc)
                await asyncio.sleep(RETRY_SECONDS)
        if not storage.shared:  # one host on its own database: a claim left by a crash cannot be live
            await asyncio.to_thread(tables.release_claims)
        if self.indexes is not None:
            await asyncio.to_thread(self.indexes.sweep, await asyncio.to_thread(tables.store_ids))
        scratch = await asyncio.to_thread(scratch_folder, self.storage.root)
        self.ingestor = Ingestor(tables, uploads.file_path, self.pool_of, self.settings, scratch)
        expiring = asyncio.create_task(self._empty_expired(tables))
        try:
            await self.ingestor.run()
        finally:
            expiring.cancel()
            await asyncio.gather(expiring, return_exceptions=True)
            shutil.rmtree(scratch, ignore_errors=True)

    async def _empty_expired(self, tables: VectorStoreTables) -> None:
        """Empty the stores that expired (:meth:`VectorStoreTables.expire`) and drop their indexes, every
        :data:`EXPIRY_SWEEP_SECONDS`; until cancelled."""
        while True:
            try:
                expired = await asyncio.to_thread(tables.expire)
            except Exception as exc:  # the database is unreachable now: the next sweep tries again
                logger.warning("vector stores: cannot empty the expired stores: %s", exc)
            else:
                if expired:
                    self.recheck()  # their files being read stop now
                    await self.forget(*expired)
            await asyncio.sleep(EXPIRY_SWEEP_SECONDS)

    def wake(self) -> None:
        """Claim attached files now (the file reader otherwise looks for them every few seconds)."""
        if self.ingestor is not None:
            self.ingestor.wake()
        else:
            self._tell(WAKE_CALL)

    def recheck(self) -> None:
        """Stop at once the reads of files that left ``in_progress`` (removed, deleted with their store, cancelled)."""
        if self.ingestor is not None:
            self.ingestor.recheck()
        else:
            self._tell(RECHECK_CALL)

    async def forget(self, *store_ids: str) -> None:
        """Drop the indexes of deleted stores, held and saved (not on the event loop), where they are held. An
        engine process that cannot be told drops them anyway: past its cache's bounds, and its saved ones when it
        starts again (:meth:`IndexCache.sweep`)."""
        if self.engine_link is not None:
            try:
                await self.engine_link.call(FORGET_CALL, list(store_ids))
            except (NotReadyError, EngineFailedError) as exc:  # the store is deleted all the same
                logger.warning("vector stores: the engine process could not drop %s: %s", ", ".join(store_ids), exc)
        elif self.indexes is not None:
            await asyncio.to_thread(self.indexes.forget, *store_ids)

    def _tell(self, name: str) -> None:
        """A front's :meth:`wake` or :meth:`recheck`, told to the engine process's file reader (on this event loop,
        its answer not awaited: a reader that is not told finds the change at its next look)."""
        if self.engine_link is None or self._loop is None or self._loop.is_closed():
            return
        task = self._loop.create_task(self.engine_link.call(name, None))
        self._telling.add(task)
        task.add_done_callback(self._told)

    def _told(self, task: asyncio.Task[Any]) -> None:
        self._telling.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.debug("vector stores: the engine process was not told: %s", task.exception())

    def collect(self) -> Iterator[Metric]:
        """The stores' indexes this process holds in memory, for ``/metrics`` (summed over a replica's processes:
        its fronts hold none, its engine process holds them once)."""
        stores, chunks = self.indexes.held if self.indexes is not None else (0, 0)
        yield GaugeMetricFamily(
            "embedrank_vector_store_indexes_held", "Vector stores whose search index is held in memory", value=stores
        )
        yield GaugeMetricFamily(
            "embedrank_vector_store_chunks_held",
            "Chunks the vector stores' search indexes held in memory hold",
            value=chunks,
        )

    def answer_fronts(self, host: EngineHost) -> None:
        """In a replica's engine process: answer its fronts' searches (:data:`SEARCH_CALL`) and what their requests
        changed (:data:`FORGET_CALL`, :data:`WAKE_CALL`, :data:`RECHECK_CALL`)."""

        async def forget(store_ids: list[str]) -> None:
            await self.opened()  # the index cache comes with the tables
            await self.forget(*store_ids)

        async def wake(_: None) -> None:
            self.wake()

        async def recheck(_: None) -> None:
            self.recheck()

        host.answer(SEARCH_CALL, self.answer_search)
        host.answer(FORGET_CALL, forget)
        host.answer(WAKE_CALL, wake)
        host.answer(RECHECK_CALL, recheck)

    def recheck_from_thread(self) -> None:
        """:meth:`recheck` from a worker thread (on the event loop the reader runs on)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.recheck)

    # -- calls --------------------------------------------------------------------------------------
    def embedder(self, model: str | None) -> tuple[str, HostedModel]:
        """The served embedding model ``model`` (default: the first), by its id."""
        model_id = model or self.pool_of().default("embeddings")
        return model_id, self._giving(model_id, "dense", "model", "a vector store needs a dense embedding model")

    def sparse_embedder(self, model: str | None) -> tuple[str, HostedModel]:
        """The served model ``model`` that gives sparse vectors (SPLADE, bge-m3; default: the first served)."""
        pool = self.pool_of()
        if model is None:
            model = next((m for m, plan in pool.described().items() if "sparse" in plan.outputs), None)
            if model is None:
                raise invalid(
                    "no SPLADE model is served, so a vector store cannot search with `splade`; serve one "
                    "(EMBEDRANK_MODELS) or choose another first stage",
                    param="sparse_model",
                    code="no_sparse_model",
                )
        return model, self._giving(model, "sparse", "sparse_model", "`sparse_model` names a SPLADE model (or bge-m3)")

    def _giving(self, model_id: str, output: str, param: str, wanted: str) -> HostedModel:
        """The served embedding model ``model_id``, refused (400, naming ``param`` and what is ``wanted``) when
        it gives no ``output`` vectors."""
        served = self.pool_of().get(model_id, "embeddings")
        if output not in served.outputs:
            raise invalid(
                f"model {shorten(model_id)!r} gives no {output} vectors; {wanted}", param=param, code="model_wrong_kind"
            )
        return served

    def planned(
        self, data: CreateVectorStoreRequest
    ) -> tuple[list[tuple[str, HostedModel]], dict[Stage, float] | None]:
        """The served models that will embed a store created with ``data`` (its embedding model, then its SPLADE
        model: the one named, or the first served when its first stage or hybrid weights ask for SPLADE), and
        its hybrid weights if it names them."""
        models = [self.embedder(data.model)]
        if data.adapter is not None:  # the adapter must be the model's: checked as a request's is
            models[0][1].resolve(adapter=data.adapter)
        weights = data.hybrid_weights
        if data.sparse_model is not None or data.first_stage == "splade" or "splade" in (weights or {}):
            models.append(self.sparse_embedder(data.sparse_model))
        return models, weights

    def embedders(self, store: StoreRow) -> list[tuple[str, HostedModel]]:
        """The served models that embed ``store``'s chunks: its embedding model, then its SPLADE model if any."""
        models = [self.embedder(store.model)]
        if store.sparse_model is not None:
            models.append(self.sparse_embedder(store.sparse_model))
        return models

    async def chunking(
        self, strategy: ChunkingStrategy | None, models: list[tuple[str, HostedModel]]
    ) -> tuple[int, int]:
        """(tokens a chunk, tokens of overlap) of ``strategy`` for a store embedded by ``models`` (id, served):
        ``auto`` is OpenAI's 800/400 within the models' windows; a static size past a model's window is refused
        (its end would not be read)."""
        windows = [(await window_of(served), model_id) for model_id, served in models]
        window, model_id = min(windows)
        if not isinstance(strategy, StaticChunking):
            size = min(AUTO_CHUNK[0], window)
            return size, min(AUTO_CHUNK[1], size // 2)
        size, overlap = strategy.static.max_chunk_size_tokens, strategy.static.chunk_overlap_tokens
        if overlap > size // 2:
            raise invalid(
                f"chunk_overlap_tokens={overlap} is more than half of max_chunk_size_tokens={size}",
                param="chunking_strategy",
            )
        if size > window:
            raise invalid(
                f"max_chunk_size_tokens={size} is more than model {shorten(model_id)!r} reads at once ({window} "
                "tokens): the rest of each chunk would not be searched; use at most that, or the auto strategy",
                param="chunking_strategy",
                code="chunk_too_large",
            )
        return size, overlap

    def ranker(self, asked: str) -> str:
        """The reranker a search's ``ranker`` names: ``none``; for ``auto``, the first served cross-encoder or
        LLM reranker (none if there is none); or a served model that reranks."""
        pool = self.pool_of()
        if asked == NO_RANKER:
            return NO_RANKER
        if asked in AUTO_RANKERS:
            return next(
                (
                    model_id
                    for model_id, plan in pool.described().items()
                    if "rerank" in plan.capabilities and "embeddings" not in plan.capabilities
                ),
                NO_RANKER,
            )
        pool.get(asked, "rerank")  # a model that is not served, or does not rerank: its error
        return asked

    @staticmethod
    def stages(
        store: StoreRow, stage: FirstStageName, weights: dict[Stage, float] | None, dense_weight: float | None
    ) -> dict[Stage, float]:
        """The stages a search of ``store`` by ``stage`` runs, with their weights in a hybrid (``weights``, else
        dense ``dense_weight`` and BM25 the rest, else the store's): a SPLADE stage needs the store's SPLADE
        model."""
        param = "first_stage"
        if stage != "hybrid":
            runs: dict[Stage, float] = {stage: 1.0}
        elif weights is not None:
            runs, param = hybrid_weights(0.0, weights), "hybrid_weights"
        elif dense_weight is not None:
            runs, param = hybrid_weights(dense_weight), "hybrid_weight"
        else:
            runs = hybrid_weights(store.hybrid_weight, store.hybrid_weights)
        if "splade" in runs and store.sparse_model is None:
            raise invalid(
                "this vector store has no sparse_model, so it cannot search with `splade`: create one with "
                "`sparse_model` (or `first_stage: splade`)",
                param=param,
                code="no_sparse_model",
            )
        return runs

    async def search(self, store: StoreRow, req: SearchRequest) -> tuple[list[str], str, list[dict[str, Any]]]:
        """``req`` over ``store``: the queries searched, the ranker, and the results best first."""
        limits = self.settings.limits
        queries = [req.query] if isinstance(req.query, str) else list(req.query)
        for i, query in enumerate(queries):
            if blank(query):
                raise invalid("query is empty or only whitespace", param="query", code="empty_query")
            if len(query) > limits.max_text_chars:
                raise invalid(
                    f"query[{i}] has {len(query)} characters; the limit is max_text_chars={limits.max_text_chars}",
                    param="query",
                    code="text_too_long",
                )
        where = self.where(req.filters)
        options = req.ranking_options
        ranker = self.ranker(options.ranker if options is not None else "auto")
        threshold = options.score_threshold if options is not None else 0.0
        stage = req.first_stage or store.first_stage
        weights = req.hybrid_weights
        hybrid = options.hybrid_search if options is not None else None
        if hybrid is not None and weights is None and req.hybrid_weight is None:  # OpenAI's weights of a hybrid
            if hybrid.embedding_weight + hybrid.text_weight <= 0:
                raise invalid(
                    "ranking_options.hybrid_search weighs neither stage: give embedding_weight or text_weight a "
                    "weight above 0",
                    param="ranking_options",
                )
            stage, weights = req.first_stage or "hybrid", hybrid.weights()
        runs = self.stages(store, stage, weights, req.hybrid_weight)
        models = self.embedders(store)
        asked = EmbedOptions(input_type="query", truncate=False, budget=limits.max_request_tokens)
        dense_asked = dataclasses.replace(asked, adapter=store.adapter)
        vectors = sparse = None
        model_id, served = models[0]
        try:
            if "dense" in runs:
                vectors = (await served.embed(queries, dense_asked)).output.embeddings
            if "splade" in runs:
                model_id, served = models[1]
                sparse = (await served.sparse(queries, asked)).output.sparse
        except InputTooLongError:
            raise invalid(
                f"the query is longer than the store's model {shorten(model_id)!r} reads at once "
                f"({served.spec.max_seq_length} tokens of its own): the rest of it could not be searched; shorten it",
                param="query",
                code="query_too_long",
            ) from None
        depth = req.max_num_results if ranker == NO_RANKER else max(req.rerank_candidates, req.max_num_results)
        call = SearchCall(store, dimension_of(models[0][1]), stage, runs, queries, vectors, sparse, req.filters, depth)
        if self.engine_link is not None:  # a front: the engine process holds the indexes
            found: list[dict[str, Any]] = await self.engine_link.call(SEARCH_CALL, call)
        else:
            found = await self.found(call, where)
        if ranker != NO_RANKER and found:
            reranked = (
                await self.pool_of()
                .get(ranker, "rerank")
                .rerank(
                    "\n".join(queries),
                    [hit["text"] for hit in found],
                    RerankOptions(chunking=Chunking(), budget=limits.max_request_tokens, top_n=req.max_num_results),
                )
            )
            found = [{**found[r.index], "score": float(r.score)} for r in reranked.ranking]
        results = [hit for hit in found[: req.max_num_results] if hit["score"] >= threshold]
        return queries, ranker, results

    async def found(self, call: SearchCall, where: Filter | None) -> list[dict[str, Any]]:
        """The ``call.depth`` best chunks of ``call.store`` that pass ``where`` (``call.filters`` parsed), best
        first, as results' fields: its index read (or brought up to date) in this process, the search run in a
        search thread, within the owner's share of them."""
        await self.opened()
        assert self.indexes is not None and self.searches is not None
        index = await self.indexes.index(call.store, call.dimension)
        ranked = await self.searches.run(
            call.store.owner,
            index.search,
            call.stage,
            call.queries,
            call.vectors,
            where,
            call.depth,
            sparse=call.sparse,
            weights=call.weights,
        )
        return chunk_results(index, ranked)

    async def answer_search(self, args: Any) -> list[dict[str, Any]]:
        """A front's :class:`SearchCall` (as MessagePack decoded it), in the engine process."""
        call = msgspec.convert(args, SearchCall)
        return await self.found(call, self.where(call.filters))

    def where(self, filters: dict[str, Any] | None) -> Filter | None:
        """A search's ``filters`` parsed within the limits (None: no filter).

        Raises:
            InvalidInputError: a malformed clause. RequestTooLargeError: past ``max_filter_clauses`` or
            ``max_filter_depth``.
        """
        limits = self.settings.limits
        if filters is None:
            return None
        return parse_filter(filters, max_clauses=limits.max_filter_clauses, max_depth=limits.max_filter_depth)


def dimension_of(served: HostedModel) -> int:
    """The length of the model's dense vectors."""
    return int(getattr(served, "dimension", None) or served.spec.dimension or 0)


def vector_stores_of(state: State) -> VectorStoreService:
    """The app's :class:`VectorStoreService` (put in its state by :func:`service.app.create_app`)."""
    return state.vector_stores  # type: ignore[no-any-return]
