"""SciFact held out from every calibration sample, and a runtime's agreement with the reference on it: what
the int8 benchmarks judge a calibration by."""

from __future__ import annotations

from typing import Any


def scifact_held_out(passages: int, queries: int) -> tuple[list[str], list[str], list[str], list[str]]:
    """SciFact's held-out documents (``passages``, seeded) and test queries (``queries``, seeded), then 200 other
    documents and every query (to draw a SciFact calibration sample from); exits when SciFact is missing."""
    import numpy as np

    from embedrank.retrieval.data import default_data_dir, doc_text, load_beir
    from embedrank.texts import seeded_sample

    root = default_data_dir()
    if root is None or not (root / "scifact" / "corpus.jsonl").is_file():
        raise SystemExit("needs SciFact in the data directory ($EMBEDRANK_DATA): python eval/get_data.py fetch scifact")
    scifact = load_beir(root / "scifact")
    docs = list(scifact.corpus.values())
    order = np.random.default_rng(1).permutation(len(docs))
    held = [doc_text(docs[i]) for i in sorted(order[:passages])]
    others = [doc_text(docs[i]) for i in sorted(order[passages : passages + 200])]
    every_query = list(scifact.queries.values())
    return held, seeded_sample(every_query, queries, seed=1), others, every_query


def held_out_agreement(want_docs: Any, got_docs: Any, want_queries: Any, got_queries: Any) -> dict[str, Any]:
    """The held-out view of a runtime's vectors (``got_*``) against the reference's (``want_*``): documents'
    mean and smallest cosine, the top-10 overlap of the queries' searches, and whether that is within ``auto``'s
    bound."""
    import numpy as np

    from embedrank.runtime.auto import embedding_agreement, within_bound

    out = embedding_agreement(want_docs, got_docs, want_queries, got_queries)
    return {
        "held-out cos mean": round(float(np.mean(np.sum(want_docs * got_docs, axis=1))), 5),
        "held-out cos min": out["cosine"],
        "held-out overlap": out["overlap"],
        "held-out in bound": "yes" if within_bound(out) else "no",
    }
