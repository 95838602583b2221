"""embedrank: text embeddings and reranking for retrieval research and RAG services.

Layers, bottom first; each imports only those before it in this list:

- :mod:`embedrank.openmp`: run first, before anything loads torch (bounds its idle OpenMP threads' spinning);
- :mod:`embedrank.errors`, :mod:`embedrank.types`, :mod:`embedrank.paths`: exceptions, the BEIR dict types
  and ``ModelOutput``, the cache and data directories;
- :mod:`embedrank.math`: pure functions (pooling, similarity, ranking, fusion, metrics, quantization);
- :mod:`embedrank.texts`, :mod:`embedrank.registry`: text sources; a model id resolved to its files and
  ``ModelSpec``;
- :mod:`embedrank.runtime`: what runs the transformer (torch, OpenVINO, ONNX Runtime) and the export cache;
- :mod:`embedrank.models`: tokenization, encoder, cross-encoder, prompts, chunking, rerankers;
- :mod:`embedrank.testing`: weightless fakes, a seeded cross-encoder, a server launcher for tests;
- :mod:`embedrank.retrieval`: BEIR data, embedding cache, indexes, BM25, retrieve-then-rerank, embedding jobs;
- :mod:`embedrank.evaluation`, :mod:`embedrank.training`: the benchmark runner behind ``eval/run.py``,
  fine-tuning;
- :mod:`embedrank.serving`: the batching engine and async model runners (no HTTP; ``service/`` adds that).

Everything a notebook needs is importable from here; these names are the stable API.

>>> import embedrank
>>> {"Encoder", "RetrieveRerank", "evaluate"} <= set(embedrank.__all__)
True
"""

from importlib import metadata as _metadata

import embedrank.openmp  # noqa: F401  first, before torch loads: it bounds libgomp's idle spinning
from embedrank.errors import (
    DataNotFoundError,
    EmbedrankError,
    IndexMismatchError,
    IndexTrainingError,
    InputTooLongError,
    InvalidInputError,
    ModelKindError,
    ModelLoadError,
    ModelNotFoundError,
    NotAModelError,
    UnsupportedMediaError,
    UnsupportedModelError,
)
from embedrank.evaluation.benchmark import (
    BenchmarkConfig,
    BenchmarkResult,
    results_table,
    run_benchmark,
    unique_systems,
)
from embedrank.evaluation.compare import SystemRun, biggest_differences, compare_systems, metric_table
from embedrank.evaluation.fusion_cv import cross_validate_fusion
from embedrank.math.fusion import reciprocal_rank_fusion, score_fusion
from embedrank.math.metrics import evaluate, evaluate_per_query
from embedrank.math.pooling import PoolingMode, pool
from embedrank.math.ranking import rank_scores, ranked_ids, top_k
from embedrank.math.similarity import cosine_scores, l2_normalize, similarity, truncate_dims
from embedrank.models.colbert import ColBERTEncoder
from embedrank.models.cross_encoder import CrossEncoder
from embedrank.models.encoder import Encoder
from embedrank.models.image_text import ImageTextEncoder
from embedrank.models.images import ImageLimits, read_image
from embedrank.models.m3 import M3Encoder
from embedrank.models.scorers import (
    BiEncoderScorer,
    CrossEncoderScorer,
    LateInteractionScorer,
    Reranker,
    load_reranker,
)
from embedrank.models.sparse import SparseEncoder
from embedrank.registry import DEFAULT_EMBEDDING_MODEL, ModelSpec, resolve
from embedrank.retrieval.bm25 import BM25Retriever
from embedrank.retrieval.cache import EmbeddingCache
from embedrank.retrieval.data import BeirDataset, doc_text, load_beir, load_trec_run, resolve_dataset, write_trec_run
from embedrank.retrieval.index import IndexConfig, build_index, load_index, recall_at_k
from embedrank.retrieval.late import MultiVectorRetriever
from embedrank.retrieval.pipeline import (
    DenseRetriever,
    HybridRetriever,
    MaxPRetriever,
    PipelineResult,
    PrecomputedRun,
    RetrieveRerank,
    WindowedDenseRetriever,
    corpus_windows,
    embed_corpus,
)
from embedrank.types import Chunking, Corpus, ModelOutput, Qrels, Queries, Run


def _version() -> str:
    """One source: pyproject.toml, as installed; from the checkout's own file when run from a checkout that
    was not installed (a tree copied to another machine)."""
    try:
        return _metadata.version("embedrank")
    except _metadata.PackageNotFoundError:
        import tomllib
        from pathlib import Path

        with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as file:
            return str(tomllib.load(file)["project"]["version"])


__version__ = _version()

__all__ = [
    "DEFAULT_EMBEDDING_MODEL",
    "BM25Retriever",
    "BeirDataset",
    "BenchmarkConfig",
    "BenchmarkResult",
    "BiEncoderScorer",
    "Chunking",
    "ColBERTEncoder",
    "Corpus",
    "CrossEncoder",
    "CrossEncoderScorer",
    "DataNotFoundError",
    "DenseRetriever",
    "EmbeddingCache",
    "EmbedrankError",
    "Encoder",
    "HybridRetriever",
    "ImageLimits",
    "ImageTextEncoder",
    "IndexConfig",
    "IndexMismatchError",
    "IndexTrainingError",
    "InputTooLongError",
    "InvalidInputError",
    "LateInteractionScorer",
    "M3Encoder",
    "MaxPRetriever",
    "ModelKindError",
    "ModelLoadError",
    "ModelNotFoundError",
    "ModelOutput",
    "ModelSpec",
    "MultiVectorRetriever",
    "NotAModelError",
    "PipelineResult",
    "PoolingMode",
    "PrecomputedRun",
    "Qrels",
    "Queries",
    "Reranker",
    "RetrieveRerank",
    "Run",
    "SparseEncoder",
    "SystemRun",
    "UnsupportedMediaError",
    "UnsupportedModelError",
    "WindowedDenseRetriever",
    "biggest_differences",
    "build_index",
    "compare_systems",
    "corpus_windows",
    "cosine_scores",
    "cross_validate_fusion",
    "doc_text",
    "embed_corpus",
    "evaluate",
    "evaluate_per_query",
    "l2_normalize",
    "load_beir",
    "load_index",
    "load_reranker",
    "load_trec_run",
    "metric_table",
    "pool",
    "rank_scores",
    "ranked_ids",
    "read_image",
    "recall_at_k",
    "reciprocal_rank_fusion",
    "resolve",
    "resolve_dataset",
    "results_table",
    "run_benchmark",
    "score_fusion",
    "similarity",
    "top_k",
    "truncate_dims",
    "unique_systems",
    "write_trec_run",
]
