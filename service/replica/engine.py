"""A replica's engine process: ``python -m service.replica.engine --socket PATH`` (started by
:mod:`service.replica.supervisor`, with the replica's environment).

It listens on ``PATH`` at once (a front that asks before the models have loaded is told to wait), loads the models
as a one-process server does (:class:`~embedrank.serving.pool.ModelPool`), starts their batching engines and serves
them with the pool's description (:class:`~embedrank.serving.remote.EngineHost`). The batch jobs and the vector
stores' file reading and expiry run here, submitting to the same engines behind the fronts' requests, and so do the
fronts' searches of the stores (their indexes held here, once for the replica).

On SIGTERM (or SIGINT) it stops taking batch lines and files, lets its engines finish what is queued (at most
``drain_seconds``) and exits 0. A model that cannot be loaded is one line and exit code 3, as a one-process server
says it (``on_model_failure = "serve-others"``: the others are served, and the fronts say which was not).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from functools import partial

from embedrank.serving import tracing as core_tracing
from embedrank.serving.allocator import trim_heap, tune_malloc
from embedrank.serving.pool import ModelPool, compute_threads
from embedrank.serving.remote import EngineHost
from service import logs, process, tracing
from service.batches.service import BatchService
from service.files.service import FileService
from service.handling import ServiceState
from service.observability import CacheMetrics, Metrics
from service.replica import FRONTS_READY_CALL
from service.routes import ROUTES
from service.settings import Settings
from service.storage.service import StorageService
from service.vector_stores.service import VectorStoreService

logger = logging.getLogger("embedrank.service")


async def serve(settings: Settings, path: str) -> int:
    """Load, serve the engines on ``path`` and run the work behind requests until SIGTERM or SIGINT; the exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals: list[int] = []

    def stopping(sig: int) -> None:
        signals.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping, sig)
    if settings.engine.tune_malloc:  # before the loading and forward threads exist
        tune_malloc()
    threads, cpus = compute_threads()
    logger.info("engine process: compute threads: %d (usable CPUs: %d)", threads, cpus)
    try:  # a model that cannot be found, an entry its model cannot serve: one line, exit code 3
        cache = settings.cache.vector_cache(settings.batches)
        pool = ModelPool(settings.models.entries, cache=cache)
    except Exception as exc:
        process.fail_to_start(exc)
    provider = tracing.provider_from_env()  # the forward passes' spans, linked to the fronts' requests
    core_tracing.use(provider)
    host = EngineHost({})
    await host.serve(path)
    keep_going = settings.models.on_model_failure == "serve-others"
    loading = asyncio.ensure_future(asyncio.to_thread(partial(pool.load, keep_going=keep_going)))
    told = asyncio.ensure_future(stop.wait())
    await asyncio.wait({loading, told}, return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():  # stopped while loading: a thread that loads is not waited for
        await host.close()
        process.exit_soon(process.exit_code(signals[0]))
        return process.exit_code(signals[0])
    told.cancel()
    try:
        loaded = loading.result()
    except Exception as exc:  # one line and exit code 3; the replica stops
        process.failed_while_serving(exc, debug=settings.telemetry.log_level == "debug")
    metrics = Metrics(ROUTES)  # the forward passes', the queues' and the batches': combined into the fronts' /metrics
    pool.start(
        loaded,
        settings.engine.engine_config(),
        on_batch=metrics.batch_observer,
        on_engine=metrics.track_engine,
        on_idle=trim_heap if settings.engine.tune_malloc else None,
    )
    gc.freeze()  # as a one-process server: the long-lived objects out of the collector's generations

    state = ServiceState(settings=settings, pool=pool, metrics=metrics)
    state.status = "ok"
    storage = StorageService(settings)
    files = FileService(storage)
    batches = BatchService(storage, files, state.ready_pool)
    stores = VectorStoreService(storage, files, state.ready_pool)
    metrics.registry.register(batches)
    metrics.registry.register(stores)
    if cache is not None:
        metrics.registry.register(CacheMetrics(cache))
    host.exposition = metrics.render
    host.serve_engines(pool.engines(), pool.describe())
    logger.info("engine process: serving %s on %s", ", ".join(pool.models), path)
    stores.answer_fronts(host)  # their searches (the indexes are held here, once) and what their requests changed

    async def fronts_ready(_: None) -> int:
        return len(host.ready_sources())

    host.answer(FRONTS_READY_CALL, fronts_ready)
    behind = [asyncio.ensure_future(batches.run()), asyncio.ensure_future(stores.run(cpus))]
    await stop.wait()
    logger.info("engine process: %s: finishing the queued work", signal.Signals(signals[0]).name)
    for task in behind:  # a batch chunk or a file in flight is not recorded: it runs again after the restart
        task.cancel()
    await asyncio.gather(*behind, return_exceptions=True)
    await pool.drain(settings.server.drain_seconds)
    await host.close()
    if provider is not None:  # what is still batched for export goes out before the exit
        core_tracing.use(None)
        await asyncio.to_thread(provider.force_flush)
    process.exit_soon(process.exit_code(signals[0]))
    return process.exit_code(signals[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.replica.engine", description=__doc__)
    parser.add_argument("--socket", required=True, help="the Unix socket the fronts reach this process on")
    args = parser.parse_args(argv)
    settings = process.settings_or_exit()
    logging.basicConfig(stream=sys.stderr, format="%(levelname)s:     [engine] %(message)s")
    logging.getLogger("embedrank").setLevel(settings.telemetry.log_level.upper())
    if settings.telemetry.log_format == "json":
        logs.use_json_lines()
    return asyncio.run(serve(settings, args.socket))


if __name__ == "__main__":
    sys.exit(main())
