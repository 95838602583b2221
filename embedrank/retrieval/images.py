"""Cross-modal retrieval with an image-text model (CLIP, SigLIP): text queries over image documents, image
queries over text documents, or any mix; each side embedded by its tower, searched by cosine in one index."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from embedrank.models.image_text import ImageTextEncoder
from embedrank.retrieval.data import doc_text
from embedrank.retrieval.index import AnyIndex, IndexConfig, build_index
from embedrank.types import Corpus, Queries, Run


def embed_mixed(
    model: ImageTextEncoder, ids: list[str], texts: Mapping[str, str], images: Mapping[str, Path], *, batch_size: int
) -> np.ndarray:
    """One vector ``(N, D)`` per id, in order: its image's (vision tower) when ``images`` has it, else its text's
    (text tower); unnormalized, as the model gives them."""
    vectors = np.zeros((len(ids), model.dimension), dtype=np.float32)
    pictured = [i for i, key in enumerate(ids) if key in images]
    worded = [i for i, key in enumerate(ids) if key not in images]
    if pictured:
        paths = [images[ids[i]] for i in pictured]
        vectors[pictured] = model.encode_images(paths, batch_size=batch_size, normalize=False)
    if worded:
        vectors[worded] = model.encode([texts[ids[i]] for i in worded], batch_size=batch_size, normalize=False)
    return vectors


class CrossModalRetriever:
    """Searches a corpus of images and texts with queries that are texts or images, by the cosine of an
    image-text model's vectors (``name``: ``dense``, a first stage like :class:`~embedrank.retrieval.dense.DenseRetriever`)."""

    name = "dense"

    def __init__(
        self,
        model: ImageTextEncoder,
        index: AnyIndex,
        *,
        query_images: Mapping[str, Path] | None = None,
        batch_size: int = 32,
    ) -> None:
        index.check_compatible(model_id=model.model_id, dimension=model.dimension)
        self.model, self.index, self.batch_size = model, index, batch_size
        self.query_images = dict(query_images or {})
        self.build_seconds = 0.0

    @classmethod
    def from_corpus(
        cls,
        model: ImageTextEncoder,
        corpus: Corpus,
        *,
        images: Mapping[str, Path] | None = None,
        query_images: Mapping[str, Path] | None = None,
        index: IndexConfig | None = None,
        batch_size: int = 32,
    ) -> CrossModalRetriever:
        """Embed ``corpus`` (a document in ``images`` by its image, any other by title + text) and index it;
        queries in ``query_images`` are searched with their image."""
        started = time.perf_counter()
        ids = list(corpus)
        texts = {d: doc_text(corpus[d]) for d in ids if d not in (images or {})}
        vectors = embed_mixed(model, ids, texts, images or {}, batch_size=batch_size)
        built = build_index(model.dimension, index, model_id=model.model_id)  # cosine by default
        built.add(ids, vectors)
        retriever = cls(model, built, query_images=query_images, batch_size=batch_size)
        retriever.build_seconds = time.perf_counter() - started
        return retriever

    def query_vectors(self, queries: Queries) -> np.ndarray:
        """``(Q, D)``: each query's image when :attr:`query_images` has it, else its text."""
        return embed_mixed(self.model, list(queries), queries, self.query_images, batch_size=self.batch_size)

    def retrieve(self, queries: Queries, k: int) -> Run:
        qids = list(queries)
        scores, ids = self.index.search(self.query_vectors(queries), k)
        return {qid: dict(zip(ids[i], map(float, scores[i]), strict=True)) for i, qid in enumerate(qids)}
