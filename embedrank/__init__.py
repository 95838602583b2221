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

from importlib import import_module as _import_module
from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

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
from embedrank.types import Chunking, Corpus, ModelOutput, Qrels, Queries, Run

# The rest of the API is imported on first use (PEP 562): `import embedrank.errors`, or the worker process that
# reads an uploaded file (`embedrank.retrieval.documents`), loads no torch. Where each name lives:
_LAZY = {
    "BenchmarkConfig": "embedrank.evaluation.benchmark",
    "BenchmarkResult": "embedrank.evaluation.benchmark",
    "results_table": "embedrank.evaluation.benchmark",
    "run_benchmark": "embedrank.evaluation.benchmark",
    "unique_systems": "embedrank.evaluation.benchmark",
    "SystemRun": "embedrank.evaluation.compare",
    "biggest_differences": "embedrank.evaluation.compare",
    "compare_systems": "embedrank.evaluation.compare",
    "metric_table": "embedrank.evaluation.compare",
    "cross_validate_fusion": "embedrank.evaluation.fusion_cv",
    "reciprocal_rank_fusion": "embedrank.math.fusion",
    "score_fusion": "embedrank.math.fusion",
    "evaluate": "embedrank.math.metrics",
    "evaluate_per_query": "embedrank.math.metrics",
    "PoolingMode": "embedrank.math.pooling",
    "pool": "embedrank.math.pooling",
    "rank_scores": "embedrank.math.ranking",
    "ranked_ids": "embedrank.math.ranking",
    "top_k": "embedrank.math.ranking",
    "cosine_scores": "embedrank.math.similarity",
    "l2_normalize": "embedrank.math.similarity",
    "similarity": "embedrank.math.similarity",
    "truncate_dims": "embedrank.math.similarity",
    "ColBERTEncoder": "embedrank.models.colbert",
    "CrossEncoder": "embedrank.models.cross_encoder",
    "Encoder": "embedrank.models.encoder",
    "ImageTextEncoder": "embedrank.models.image_text",
    "ImageLimits": "embedrank.models.images",
    "read_image": "embedrank.models.images",
    "M3Encoder": "embedrank.models.m3",
    "BiEncoderScorer": "embedrank.models.scorers",
    "CrossEncoderScorer": "embedrank.models.scorers",
    "LateInteractionScorer": "embedrank.models.scorers",
    "Reranker": "embedrank.models.scorers",
    "load_reranker": "embedrank.models.scorers",
    "SparseEncoder": "embedrank.models.sparse",
    "DEFAULT_EMBEDDING_MODEL": "embedrank.registry",
    "ModelSpec": "embedrank.registry",
    "resolve": "embedrank.registry",
    "BM25Retriever": "embedrank.retrieval.bm25",
    "EmbeddingCache": "embedrank.retrieval.cache",
    "BeirDataset": "embedrank.retrieval.data",
    "doc_text": "embedrank.retrieval.data",
    "load_beir": "embedrank.retrieval.data",
    "load_trec_run": "embedrank.retrieval.data",
    "resolve_dataset": "embedrank.retrieval.data",
    "write_trec_run": "embedrank.retrieval.data",
    "IndexConfig": "embedrank.retrieval.index",
    "build_index": "embedrank.retrieval.index",
    "load_index": "embedrank.retrieval.index",
    "recall_at_k": "embedrank.retrieval.index",
    "MultiVectorRetriever": "embedrank.retrieval.late",
    "DenseRetriever": "embedrank.retrieval.pipeline",
    "HybridRetriever": "embedrank.retrieval.pipeline",
    "MaxPRetriever": "embedrank.retrieval.pipeline",
    "PipelineResult": "embedrank.retrieval.pipeline",
    "PrecomputedRun": "embedrank.retrieval.pipeline",
    "RetrieveRerank": "embedrank.retrieval.pipeline",
    "WindowedDenseRetriever": "embedrank.retrieval.pipeline",
    "corpus_windows": "embedrank.retrieval.pipeline",
    "embed_corpus": "embedrank.retrieval.pipeline",
}

if TYPE_CHECKING:  # the same names, for type checkers and editors
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
    from embedrank.retrieval.data import (
        BeirDataset,
        doc_text,
        load_beir,
        load_trec_run,
        resolve_dataset,
        write_trec_run,
    )
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


def __getattr__(name: str) -> Any:
    """Import the API name ``name`` from its module the first time it is used."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'embedrank' has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
