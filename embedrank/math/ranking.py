"""Sorting scores into rankings, with one deterministic tie-break for each kind of ranking.

- Documents of a run (``{doc_id: score}``): score descending, then doc id **descending**, the order
  trec_eval uses. Fusion, ``top_k``, TREC run files, pipeline frames and metrics all use :func:`ranked_ids`.
- Candidates of one rerank call (an array of scores): score descending, then input index ascending
  (:func:`rank_scores`), as Cohere and sentence-transformers' ``CrossEncoder.rank`` do.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from embedrank.errors import InvalidInputError
from embedrank.types import Run


@dataclasses.dataclass(frozen=True)
class RankedResult:
    index: int
    score: float


def rank_scores(scores: np.ndarray, top_k: int | None = None) -> list[RankedResult]:
    """Indices of ``scores`` ``(N,)`` sorted by score descending, ties by index ascending.

    Examples:
        >>> [r.index for r in rank_scores(np.array([0.5, 0.9, 0.5, 0.1]), top_k=3)]
        [1, 0, 2]
    """
    if top_k is not None and top_k < 1:
        raise InvalidInputError(f"top_k must be >= 1, got {top_k}", param="top_k")
    values = np.asarray(scores, dtype=np.float64)
    order = np.lexsort((np.arange(len(values)), -values))  # primary: -score, secondary: index
    if top_k is not None:
        order = order[:top_k]
    return [RankedResult(index=int(i), score=float(values[i])) for i in order]


def ranked_ids(docs: dict[str, float]) -> list[str]:
    """Doc ids in trec_eval's order: score descending, then doc id descending.

    >>> ranked_ids({"a": 1.0, "b": 1.0, "c": 2.0})
    ['c', 'b', 'a']
    """
    return [d for d, _ in sorted(docs.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)]


def top_k(run: Run, k: int) -> Run:
    """Keep the ``k`` best documents per query, in :func:`ranked_ids` order; the input is not mutated.

    >>> top_k({"q": {"a": 1.0, "b": 1.0, "c": 0.5}}, 1)
    {'q': {'b': 1.0}}
    """
    return {qid: {d: docs[d] for d in ranked_ids(docs)[:k]} for qid, docs in run.items()}
