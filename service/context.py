"""What an endpoint's call needs besides its body (:class:`Context`): built once when the service starts, and
shared by the routes, the fast path and batch lines (which read their vectors from the cache)."""

from __future__ import annotations

import dataclasses

from embedrank.serving.pool import ModelPool
from service.settings import Limits, Settings

BACKGROUND_PRIORITY = 1_000_000
"""The engine priority of the work the service does behind requests (batch lines, the files a vector store
reads): behind every direct request (whose default is 0), at any priority a client may ask for below it."""


@dataclasses.dataclass(frozen=True)
class Context:
    """The served models, the settings, and whether the dense vectors of texts embedded before come from the
    model's vector cache (``cached``: batch lines always; direct requests when ``embedding_cache_direct`` is
    set)."""

    pool: ModelPool
    settings: Settings
    cached: bool = False

    @property
    def limits(self) -> Limits:
        return self.settings.limits

    @classmethod
    def of(cls, pool: ModelPool, settings: Settings) -> Context:
        """The context of direct requests (batch lines make theirs with ``cached=True``)."""
        return cls(pool, settings, cached=settings.cache.embedding_cache_direct)
