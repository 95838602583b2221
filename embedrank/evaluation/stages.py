"""The first stages a benchmark configuration builds (:func:`~embedrank.evaluation.benchmark.run_benchmark`):
BM25 (over whole documents or their windows), SPLADE and the dense stage, each saying in ``notes`` what it runs."""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING

from embedrank.models.chunking import Chunking
from embedrank.models.encoder import Encoder
from embedrank.models.image_text import ImageTextEncoder
from embedrank.models.sparse import SparseEncoder
from embedrank.retrieval.bm25 import BM25Retriever
from embedrank.retrieval.cache import EmbeddingCache
from embedrank.retrieval.data import BeirDataset, load_trec_run
from embedrank.retrieval.dense import corpus_windows
from embedrank.retrieval.images import CrossModalRetriever
from embedrank.retrieval.index import IndexConfig, is_index_dir
from embedrank.retrieval.pipeline import DenseRetriever, FirstStage, PrecomputedRun, WindowedDenseRetriever
from embedrank.retrieval.sparse import SparseRetriever
from embedrank.retrieval.stages import MaxPRetriever

if TYPE_CHECKING:
    from embedrank.evaluation.config import BenchmarkConfig

__all__ = ["bm25_stage", "bm25_windows_stage", "cached_encoder", "dense_stage", "image_text_stage", "splade_stage"]


@functools.lru_cache(maxsize=4)  # several runs of one command share a model
def cached_encoder(
    model_id: str, backend: str | None = None, precision: str | None = None, device: str = "cpu"
) -> Encoder:
    return Encoder.from_pretrained(model_id, backend=backend, precision=precision, device=device)


def bm25_stage(ds: BeirDataset, cfg: BenchmarkConfig, notes: list[str]) -> FirstStage:
    """The collection's published BM25 run when it ships one (unless ``cfg.fresh_bm25``), else bm25s; with
    ``cfg.bm25_windows``, bm25s over the windows of :func:`bm25_windows_stage`, a document scored by its best."""
    if cfg.bm25_windows:
        return MaxPRetriever(*bm25_windows_stage(ds, cfg, notes))
    shipped = ds.first_stage_runs
    if shipped and not cfg.fresh_bm25:
        notes.append(
            f"BM25: using the collection's published run {shipped[0].name} (pass --fresh-bm25 to compute BM25)"
        )
        return PrecomputedRun(load_trec_run(shipped[0]), name=f"bm25[{shipped[0].name}]")
    notes.append("BM25: computed with bm25s (k1=0.9, b=0.4, Lucene IDF, English stemming)")
    return BM25Retriever.from_corpus(ds.corpus)


def bm25_windows_stage(ds: BeirDataset, cfg: BenchmarkConfig, notes: list[str]) -> tuple[BM25Retriever, list[str]]:
    """bm25s over the corpus's windows (of ``cfg.dense_window`` tokens of ``cfg.model``, or its length; 32 tokens
    overlap: the windowed dense stage's), and each window's document id."""
    encoder = cached_encoder(cfg.model, cfg.backend, cfg.precision, cfg.device)
    windows, owners = corpus_windows(encoder, ds.corpus, Chunking(window=cfg.dense_window))
    window = cfg.dense_window or encoder.chunk_window()
    notes.append(
        f"BM25: computed with bm25s (k1=0.9, b=0.4, Lucene IDF, English stemming) over {len(windows)} windows of up "
        f"to {window} tokens of the {len(ds.corpus)} documents, a document scored by its best window (MaxP)"
    )
    return BM25Retriever.from_corpus(windows), owners


# a corpus encoded once per (model, collection, backend, device, windows, window length)
_SPLADE: dict[tuple[str, str, str | None, str, bool, int | None], SparseRetriever] = {}


def splade_stage(ds: BeirDataset, cfg: BenchmarkConfig, notes: list[str]) -> FirstStage:
    """SPLADE over the collection (the corpus is encoded once per process and model)."""
    key = (cfg.sparse_model, str(ds.path), cfg.backend, cfg.device, cfg.sparse_windows, cfg.sparse_max_seq_length)
    if key not in _SPLADE:
        named = cfg.backend if cfg.backend not in (None, "auto") else None  # fp32 on the named backend
        encoder = SparseEncoder.from_pretrained(
            cfg.sparse_model, backend=named, max_seq_length=cfg.sparse_max_seq_length, device=cfg.device
        )
        chunking = Chunking() if cfg.sparse_windows else None
        _SPLADE[key] = SparseRetriever.from_corpus(encoder, ds.corpus, chunking=chunking)
    reads = "every window of a long document (max per term)" if cfg.sparse_windows else "the first window"
    window = _SPLADE[key].encoder.max_seq_length
    notes.append(f"SPLADE: {cfg.sparse_model}, exact sparse dot products; reads {reads} of {window} tokens")
    return _SPLADE[key]


def dense_stage(
    ds: BeirDataset, cfg: BenchmarkConfig, notes: list[str], sizes: list[float], timings: dict[str, float]
) -> DenseRetriever | WindowedDenseRetriever:
    """The dense stage: ``cfg.model`` over the corpus (windowed with ``cfg.dense_windows``, in windows of
    ``cfg.dense_window`` tokens or the model's length), or over ``cfg.embeddings``; adds the index's bytes per
    vector to ``sizes`` and its build time to ``timings``."""
    t0 = time.perf_counter()
    cache = EmbeddingCache(cfg.cache_dir) if cfg.use_cache else False
    index = IndexConfig(kind=cfg.index, rescore=cfg.rescore, rescore_multiplier=cfg.rescore_multiplier)
    encoder = cached_encoder(cfg.model, cfg.backend, cfg.precision, cfg.device)
    retriever: DenseRetriever | WindowedDenseRetriever
    if cfg.embeddings and is_index_dir(cfg.embeddings):
        retriever = DenseRetriever.from_index(encoder, cfg.embeddings, corpus=ds.corpus, batch_size=cfg.batch_size)
    elif cfg.embeddings:
        retriever = DenseRetriever.from_embeddings(
            encoder, cfg.embeddings, corpus=ds.corpus, index=index, batch_size=cfg.batch_size
        )
    elif cfg.dense_windows:
        retriever = WindowedDenseRetriever.from_corpus(
            encoder,
            ds.corpus,
            chunking=Chunking(window=cfg.dense_window),
            index=index,
            batch_size=cfg.batch_size,
            cache=cache,
            show_progress=cfg.show_progress,
        )
        window = cfg.dense_window or encoder.chunk_window()  # a longer window was refused
        notes.append(
            f"dense: {len(retriever.owners)} windows of up to {window} tokens of the {len(ds.corpus)} documents "
            "embedded, a document scored by its best window (MaxP)"
        )
    else:
        retriever = DenseRetriever.from_corpus(
            encoder, ds.corpus, index=index, batch_size=cfg.batch_size, cache=cache, show_progress=cfg.show_progress
        )
    timings["index_s"] = time.perf_counter() - t0
    assert retriever.corpus_embeddings is not None
    notes.append(retriever.corpus_embeddings.describe())
    choice = encoder.auto_choice
    if choice is not None:  # backend/precision auto: say what runs and why
        notes.append(f"auto chose {choice.summary}")
    searched = retriever.windows.index if isinstance(retriever, WindowedDenseRetriever) else retriever.index
    size = getattr(searched, "bytes_per_vector", None)
    if size is not None:
        sizes.append(size)
        rescored = f", rescored by {cfg.rescore} x{cfg.rescore_multiplier}" if cfg.index == "binary" else ""
        notes.append(
            f"index: {cfg.index}{rescored}, {size:.0f} bytes per vector "
            f"({size * len(searched) / 2**20:.2f} MiB for {len(searched)} {'windows' if cfg.dense_windows else 'documents'})"
        )
    return retriever


def image_text_stage(
    ds: BeirDataset, cfg: BenchmarkConfig, notes: list[str], timings: dict[str, float]
) -> CrossModalRetriever:
    """The dense stage of a collection with images: ``cfg.model`` (an image-text model) embeds image documents
    and queries with its vision tower, the others with its text tower, searched by cosine."""
    model = ImageTextEncoder.from_pretrained(cfg.model, backend=cfg.backend, device=cfg.device)
    index = IndexConfig(kind=cfg.index, rescore=cfg.rescore, rescore_multiplier=cfg.rescore_multiplier)
    retriever = CrossModalRetriever.from_corpus(
        model, ds.corpus, images=ds.images, query_images=ds.query_images, index=index, batch_size=cfg.batch_size
    )
    timings["index_s"] = retriever.build_seconds
    pictured = sum(q in ds.query_images for q in ds.queries)
    notes.append(
        f"image-text: {len(ds.images)} of {len(ds.corpus)} documents and {pictured} of {len(ds.queries)} queries "
        f"embedded as images by {cfg.model} ({model.backend}), the rest as text"
    )
    return retriever
