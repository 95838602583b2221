"""What lies beside a transformer's weights and decides how its outputs are read: bge-m3's lexical and
multi-vector heads, a Stanford ColBERT checkpoint's ``artifact.metadata``, a PyLate ColBERT's lengths."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from embedrank.registry.files import read_dict

M3_HEADS = ("sparse_linear.pt", "colbert_linear.pt")


def has_m3_heads(root: Path) -> bool:
    """bge-m3's two heads are beside the weights (:mod:`embedrank.models.m3`)."""
    return all((root / head).is_file() for head in M3_HEADS)


@dataclasses.dataclass(frozen=True)
class StanfordColBERT:
    """A Stanford ColBERT checkpoint's document window and token-vector width (``artifact.metadata``)."""

    document_length: int
    dimension: int


def read_stanford_colbert(root: Path) -> StanfordColBERT:
    meta = read_dict(root / "artifact.metadata")
    return StanfordColBERT(int(meta.get("doc_maxlen") or 180), int(meta.get("dim") or 128))


def pylate_document_length(root: Path) -> int | None:
    """A PyLate ColBERT's document window (``config_sentence_transformers.json``; 180 when it says none, None
    when it gives an empty value)."""
    value = read_dict(root / "config_sentence_transformers.json").get("document_length", 180)
    return int(value) if value else None
