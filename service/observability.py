"""Prometheus metrics: requests by route and status, latency, batch sizes, queue depth, tokens, the embedding
cache; and one exposition of a replica's several processes (:func:`combined`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from embedrank.serving.engine import BatchEngine, BatchReport
from embedrank.serving.vector_cache import VectorCache
from service.errors import matches_route


class Metrics:
    """One registry per app, so several apps (tests) never share counters."""

    def __init__(self, routes: frozenset[str]) -> None:
        self.routes = routes  # the app's route table; any other path is counted as route ``other``
        self._templates = sorted(r for r in routes if "{" in r)  # routes with path parameters: their template
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "embedrank_requests_total", "HTTP requests", ["route", "method", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "embedrank_request_seconds",
            "HTTP request latency in seconds",
            ["route", "status"],
            registry=self.registry,
            buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.batch_size = Histogram(
            "embedrank_batch_size",
            "Items per forward pass",
            ["model"],
            registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        )
        self.batch_padded_tokens = Histogram(
            "embedrank_batch_padded_tokens",
            "Estimated padded tokens per forward pass",
            ["model"],
            registry=self.registry,
            buckets=(64, 256, 1024, 2048, 4096, 8192, 16384, 32768),
        )
        self.batch_seconds = Histogram(
            "embedrank_batch_seconds",
            "Compute time per batch (tokenize, forward pass, pooling) in the worker thread",
            ["model"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.tokens = Counter(
            "embedrank_tokens_total", "Tokens processed by the models", ["model"], registry=self.registry
        )
        self._request_children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self.queue_depth = Gauge(
            "embedrank_queue_depth", "Items waiting in the engine queue", ["model"], registry=self.registry
        )
        self.in_progress = Gauge(
            "embedrank_requests_in_progress",
            "HTTP requests being served, bodies still arriving included",
            registry=self.registry,
        )
        self.dropped = Gauge(
            "embedrank_dropped_items",
            "Queued items dropped because their client went away",
            ["model"],
            registry=self.registry,
        )

    def route_of(self, path: str) -> str:
        """The route ``path`` is counted under: itself, the template of a route with path parameters
        (``/v1/files/{file_id:str}``), or ``other``."""
        return path if path in self.routes else next((t for t in self._templates if matches_route(t, path)), "other")

    def observe_request(self, path: str, method: str, status: int, seconds: float) -> None:
        """Count one HTTP request and its latency under its route (a route with path parameters under its
        template, ``/v1/files/{file_id:str}``); unknown paths are counted as route ``other``."""
        key = (self.route_of(path), method, status)
        children = self._request_children.get(key)
        if children is None:  # label lookups take a lock; do them once per (route, method, status)
            route, _, _ = key
            children = (self.requests.labels(route, method, str(status)), self.latency.labels(route, str(status)))
            self._request_children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def batch_observer(self, model: str) -> Callable[[BatchReport], None]:
        size, padded, tokens = (
            self.batch_size.labels(model),
            self.batch_padded_tokens.labels(model),
            self.tokens.labels(model),
        )
        seconds = self.batch_seconds.labels(model)

        def observe(report: BatchReport) -> None:
            size.observe(report.items)
            padded.observe(report.padded_tokens)
            tokens.inc(report.tokens)
            seconds.observe(report.seconds)

        return observe

    def track_engine(self, model: str, engine: BatchEngine[Any]) -> None:
        """Report ``engine``'s queue depth and dropped work under the label ``model``."""
        self.queue_depth.labels(model).set_function(lambda: engine.queue_depth)
        self.dropped.labels(model).set_function(lambda: engine.dropped)

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclasses.dataclass(eq=False)  # a collector of the app's metrics registry: hashed by identity
class CacheMetrics:
    """The embedding cache's lookups (hits, misses) and evictions by this process, and what the cache holds
    (entries, bytes: every process that shares its file), read at each scrape."""

    cache: VectorCache

    def collect(self) -> Iterator[Metric]:
        lookups = CounterMetricFamily(
            "embedrank_embedding_cache_lookups", "Texts looked up in the embedding cache", labels=["result"]
        )
        lookups.add_metric(["hit"], self.cache.hits)
        lookups.add_metric(["miss"], self.cache.misses)
        evictions = CounterMetricFamily(
            "embedrank_embedding_cache_evictions", "Entries evicted (least recently used) to keep the cache's bound"
        )
        evictions.add_metric([], self.cache.evictions)
        failures = CounterMetricFamily(
            "embedrank_embedding_cache_failures", "Cache reads or writes that failed (counted as misses)"
        )
        failures.add_metric([], self.cache.failures)
        entries, size = self.cache.stats()
        yield lookups
        yield evictions
        yield failures
        yield GaugeMetricFamily("embedrank_embedding_cache_entries", "Vectors the embedding cache holds", value=entries)
        yield GaugeMetricFamily(
            "embedrank_embedding_cache_bytes", "Bytes the embedding cache holds, against its bound", value=size
        )


SHARED_GAUGES = frozenset(
    {
        "embedrank_batches_unfinished",
        "embedrank_batch_lines_waiting",
        "embedrank_batch_lines_done",
        "embedrank_embedding_cache_entries",
        "embedrank_embedding_cache_bytes",
    }
)
"""Gauges that each process reads from what the replica's processes share (the batch database, the cache file):
counted once (the largest), not summed."""


def combined(expositions: Iterable[tuple[bytes, bool]]) -> bytes:
    """One Prometheus exposition of several processes' ``(text, alive)``: counters and histograms summed over
    every process (one that ended still counts, so that the replica's counters never go back), gauges summed over
    the live ones, except :data:`SHARED_GAUGES` (the largest). ``_created`` samples are left out (a sum of
    creation times means nothing).

    >>> one = b'# TYPE embedrank_tokens counter\\nembedrank_tokens_total{model="m"} 3.0\\n'
    >>> two = b'# TYPE embedrank_tokens counter\\nembedrank_tokens_total{model="m"} 4.0\\n'
    >>> print(combined([(one, True), (two, False)]).decode().splitlines()[-1])
    embedrank_tokens_total{model="m"} 7.0
    """
    families: dict[str, Metric] = {}
    values: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
    for text, alive in expositions:
        for family in text_string_to_metric_families(text.decode()):
            if family.type == "gauge" and not alive:
                continue
            families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                key = (family.name, sample.name, tuple(sorted(sample.labels.items())))
                before = values.get(key)
                if before is None:
                    values[key] = sample.value
                elif family.name in SHARED_GAUGES:
                    values[key] = max(before, sample.value)
                else:
                    values[key] = before + sample.value
    for (name, sample_name, labels), value in values.items():
        families[name].add_sample(sample_name, dict(labels), value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


@dataclasses.dataclass(eq=False)
class _Families:
    """A collector of fixed metric families (what :func:`combined` renders)."""

    families: list[Metric]

    def collect(self) -> Iterator[Metric]:
        yield from self.families
