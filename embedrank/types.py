"""Named types for the BEIR dict format, shared by data loading, retrieval and metrics."""

from __future__ import annotations

from typing import TypeAlias

Corpus: TypeAlias = dict[str, dict[str, str]]
"""``{doc_id: {"title": str, "text": str}}``"""

Queries: TypeAlias = dict[str, str]
"""``{query_id: query_text}``"""

Qrels: TypeAlias = dict[str, dict[str, int]]
"""``{query_id: {doc_id: relevance}}``; relevance is graded (0 = judged not relevant)."""

Run: TypeAlias = dict[str, dict[str, float]]
"""``{query_id: {doc_id: score}}``; higher is better."""
