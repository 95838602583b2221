"""The names systems are reported under, from the configuration that runs them: what ``--test``,
``--baseline``, run files and result tables use."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from embedrank.registry import DEFAULT_EMBEDDING_MODEL
from embedrank.runtime.backends import check_backend

if TYPE_CHECKING:
    from embedrank.evaluation.config import BenchmarkConfig

__all__ = ["first_stage_name", "system_name"]


def _runtime_suffix(cfg: BenchmarkConfig) -> str:
    """``~bf16``/``~int8`` for a precision other than fp32 (its results differ); fp32 backends agree to 1e-4
    and share names."""
    precision = check_backend(cfg.backend, cfg.precision)[1]
    return "" if precision == "fp32" else f"~{precision}"


def first_stage_name(cfg: BenchmarkConfig) -> str:
    """The first stage's name: the retriever, ``@`` and the embedding model's short name when it is not the
    default one (BM25 and SPLADE use no dense model), ``~maxp`` for windowed dense stages (which name their
    model, default or not; ``~maxpN`` for windows of ``N`` tokens), ``splade~N`` for a SPLADE stage reading ``N`` tokens instead of its model's own
    window and ``splade~windows`` for one reading every window (alone or as a fusion's part), ``bm25~maxp`` for
    BM25 over windows and ``hybrid~maxp`` for a hybrid fused per window, ``~int8``/``~bf16`` for a lower precision.

    >>> from embedrank.evaluation.config import BenchmarkConfig
    >>> first_stage_name(BenchmarkConfig(retriever="hybrid", model="models/MiniLM-SciFact/"))
    'hybrid@minilm-scifact'
    >>> first_stage_name(BenchmarkConfig(retriever="hybrid:bm25+dense+splade", dense_windows=True))
    'hybrid:bm25+dense+splade@all-minilm-l6-v2~maxp'
    >>> first_stage_name(BenchmarkConfig(retriever="dense", dense_windows=True, dense_window=128))
    'dense@all-minilm-l6-v2~maxp128'
    >>> first_stage_name(BenchmarkConfig(retriever="hybrid:bm25+dense+splade", sparse_windows=True))
    'hybrid:bm25+dense+splade~windows'
    >>> first_stage_name(BenchmarkConfig(retriever="hybrid", dense_windows=True, bm25_windows=True))
    'hybrid~maxp@all-minilm-l6-v2~maxp'
    >>> first_stage_name(BenchmarkConfig(retriever="splade", sparse_max_seq_length=512))
    'splade~512'
    """
    name: str = cfg.retriever
    length = f"~{cfg.sparse_max_seq_length}" if cfg.sparse_max_seq_length else ""
    sparse = "splade" + length + ("~windows" if cfg.sparse_windows else "")
    if sparse != "splade":  # the SPLADE part is named where it stands, so a fusion's parts keep their names
        kind, colon, parts = name.rpartition(":")
        name = kind + colon + "+".join(sparse if p == "splade" else p for p in parts.split("+"))
    window = f"~maxp{cfg.dense_window or ''}"
    if cfg.bm25_windows:  # BM25 over windows, alone or fused per window with the dense stage
        name += window
    if cfg.retriever in ("bm25", "splade"):
        return name
    if cfg.model not in (DEFAULT_EMBEDDING_MODEL, "all-MiniLM-L6-v2") or cfg.dense_windows:
        name += f"@{Path(cfg.model.rstrip('/')).name.lower()}"
    return name + (window if cfg.dense_windows else "") + _runtime_suffix(cfg)


def system_name(cfg: BenchmarkConfig) -> str:
    """The name a configuration's system is reported under: its first stage's, then ``>`` and the
    reranker's short name when there is one.

    >>> from embedrank.evaluation.config import BenchmarkConfig
    >>> system_name(BenchmarkConfig(retriever="bm25", reranker="cross-encoder/ms-marco-MiniLM-L6-v2"))
    'bm25>ms-marco-minilm-l6-v2'
    """
    first = first_stage_name(cfg)
    if not cfg.reranker:
        return first
    return f"{first}>{Path(cfg.reranker.rstrip('/')).name.lower()}{_runtime_suffix(cfg)}"
