"""BM25 first stage on top of the maintained ``bm25s`` library (Lucene scoring, English stemming)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from embedrank.retrieval.data import doc_text
from embedrank.types import Corpus, Queries, Run


class BM25Retriever:
    """Lexical retrieval over a list of documents with string ids.

    Defaults follow Anserini's BEIR baseline: ``k1=0.9``, ``b=0.4``, Lucene IDF, English stop words
    and the Snowball English stemmer (PyStemmer) when it is installed.
    """

    name = "bm25"

    def __init__(self, ids: Sequence[str], texts: Sequence[str], *, k1: float = 0.9, b: float = 0.4) -> None:
        import bm25s

        self.ids = [str(i) for i in ids]
        self._stemmer = _stemmer()
        tokens = bm25s.tokenize(list(texts), stopwords="en", stemmer=self._stemmer, show_progress=False)
        self._retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
        self._retriever.index(tokens, show_progress=False)
        self.k1, self.b = k1, b

    @classmethod
    def from_corpus(cls, corpus: Corpus, *, k1: float = 0.9, b: float = 0.4) -> BM25Retriever:
        """BM25 over a BEIR corpus; a document's text is ``title + " " + text``."""
        ids = list(corpus)
        return cls(ids, [doc_text(corpus[d]) for d in ids], k1=k1, b=b)

    def retrieve(self, queries: Queries, k: int, *, allowed: np.ndarray | None = None) -> Run:
        """Top ``k`` documents per query as a BEIR run; with ``allowed`` ``(N,)`` bool, among those documents only
        (the others score 0 and are not returned: no document outside the mask is ranked)."""
        import bm25s

        qids = list(queries)
        k = min(k, len(self.ids))
        tokens = bm25s.tokenize(
            [queries[q] for q in qids], stopwords="en", stemmer=self._stemmer, return_ids=False, show_progress=False
        )
        vocab = self._retriever.vocab_dict
        run: Run = {}
        searchable = [i for i, t in enumerate(tokens) if any(w in vocab for w in t)]
        for qid in qids:
            run[qid] = {}  # a query with no known term retrieves nothing
        if searchable:
            docs, scores = self._retriever.retrieve(
                [[w for w in tokens[i] if w in vocab] for i in searchable],
                k=k,
                show_progress=False,
                n_threads=0,
                weight_mask=None if allowed is None else allowed.astype(np.float32),
            )
            for row, i in enumerate(searchable):
                run[qids[i]] = {
                    self.ids[int(d)]: float(s)
                    for d, s in zip(docs[row], scores[row], strict=True)
                    if np.isfinite(s) and s > 0
                }
        return run


def _stemmer():
    try:
        import Stemmer
    except ImportError:  # pragma: no cover - PyStemmer is a dependency; stay usable without it
        return None
    return Stemmer.Stemmer("english").stemWords
