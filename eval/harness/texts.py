"""The texts the speed benchmarks encode: queries and passages from the data directory, else synthetic ones."""

from __future__ import annotations


def workloads(n_queries: int, n_passages: int) -> tuple[dict[str, list[str]], str]:
    from embedrank.retrieval.data import default_data_dir, doc_text, load_beir

    root = default_data_dir()
    if root is not None and (root / "scifact" / "corpus.jsonl").is_file():
        scifact = load_beir(root / "scifact", split="train")
        queries = list(scifact.queries.values())
        if len(queries) < n_queries and (root / "nfcorpus-preprocessed-partial" / "queries.jsonl").is_file():
            queries += list(load_beir(root / "nfcorpus-preprocessed-partial").queries.values())
        queries = (queries * (n_queries // max(len(queries), 1) + 1))[:n_queries]
        passages = [doc_text(d) for d in list(scifact.corpus.values())[:n_passages]]
        return {"queries": queries, "passages": passages}, "SciFact (+ NFCorpus queries)"
    import random

    rng = random.Random(0)
    words = "retrieval dense sparse ranking passage query vector embedding model transformer index".split()
    return {
        "queries": [" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) for _ in range(n_queries)],
        "passages": [" ".join(rng.choice(words) for _ in range(rng.randint(120, 250))) for _ in range(n_passages)],
    }, "synthetic texts (no $EMBEDRANK_DATA)"
