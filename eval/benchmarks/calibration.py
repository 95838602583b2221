#!/usr/bin/env python
"""Which sample int8 should be calibrated and judged on: the packaged MiniLM's int8 runtimes, side by side,
with each candidate sample, against OpenVINO fp32 (the default, within 1e-5 of sentence-transformers).

Samples (300 texts each, seeded, as :func:`embedrank.runtime.exports.calibration_texts` takes them):

- ``vocabulary``: pseudo-sentences drawn from the model's vocabulary (:func:`embedrank.texts.vocabulary_texts`);
- ``packaged``: the sample shipped with the package (:func:`embedrank.texts.packaged_sample`, the default);
- ``scifact``: SciFact documents and queries from the data directory (not the held-out ones below).

For each int8 runtime (OpenVINO static int8 calibrated on the sample by NNCF; ONNX Runtime dynamic int8,
which needs no calibration and is the same graph for every sample) two views:

- ``auto check``: what ``backend="auto"`` measures on the sample's first 64 texts (the smallest cosine, and
  the top-10 overlap with each text's first 8 words as a query; :func:`embedrank.runtime.auto.embedding_agreement`)
  and whether that is within its bound (cosine >= 0.98, overlap >= 0.9): whether ``auto`` would take it;
- ``held out``: the same figures, and the mean cosine, on data none of the samples holds: ``--passages``
  SciFact documents searched by ``--queries`` SciFact test queries (the true cost for a SciFact user).

    python -m eval bench calibration            # needs SciFact in $EMBEDRANK_DATA
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import embedrank.openmp  # noqa: F401  before torch, as in the server
from eval.harness.held_out import held_out_agreement, scifact_held_out


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--passages", type=int, default=400, help="held-out SciFact documents")
    p.add_argument("--queries", type=int, default=300, help="held-out SciFact test queries")
    p.add_argument("--cache-dir", help="exports go here (default: a temporary folder, so every export is made)")
    args = p.parse_args(argv)

    import numpy as np
    import pandas as pd
    from transformers import AutoTokenizer

    from embedrank import Encoder
    from embedrank.registry import DEFAULT_EMBEDDING_MODEL, resolve
    from embedrank.runtime.auto import BOUNDS, CHECK_TEXTS, embedding_agreement, within_bound
    from embedrank.runtime.cpus import cpu_identity
    from embedrank.runtime.exports import CALIBRATION_SIZE
    from embedrank.texts import packaged_sample, seeded_sample, vocabulary_texts

    held_docs, held_queries, calib_docs, queries = scifact_held_out(args.passages, args.queries)
    spec = resolve(DEFAULT_EMBEDDING_MODEL)
    tokenizer = AutoTokenizer.from_pretrained(spec.path)
    samples = {
        "vocabulary": vocabulary_texts(tokenizer.get_vocab(), n=CALIBRATION_SIZE),
        "packaged": seeded_sample(packaged_sample(), CALIBRATION_SIZE),
        "scifact": calib_docs + [q for q in queries if q not in set(held_queries)][:100],
    }
    cache = args.cache_dir or tempfile.mkdtemp(prefix="embedrank-calibration-")

    def vectors(enc: Encoder, texts: list[str]) -> np.ndarray:
        return enc.encode(texts, batch_size=32, show_progress=False)

    held: dict[int, dict[str, np.ndarray]] = {}  # per encoder: the held-out vectors do not depend on the sample

    def views(enc: Encoder, sample: list[str]) -> dict[str, np.ndarray]:
        if id(enc) not in held:
            held[id(enc)] = {"docs": vectors(enc, held_docs), "queries": vectors(enc, held_queries)}
        checks = sample[:CHECK_TEXTS]
        return {
            "checks": vectors(enc, checks),
            "heads": vectors(enc, [" ".join(t.split()[:8]) for t in checks]),
            **held[id(enc)],
        }

    reference = Encoder.from_pretrained(backend="openvino", precision="fp32", cache_dir=cache)
    expected = {name: views(reference, texts) for name, texts in samples.items()}
    rows = []
    onnx = Encoder.from_pretrained(backend="onnx", precision="int8", cache_dir=cache)
    for name, texts in samples.items():
        for runtime, enc in (
            (
                "openvino int8 (static, NNCF)",
                Encoder.from_pretrained(precision="int8", calibration=texts, cache_dir=cache),
            ),
            ("onnx int8 (dynamic)", onnx),
        ):
            got, want = views(enc, texts), expected[name]
            check = embedding_agreement(want["checks"], got["checks"], want["heads"], got["heads"])
            rows.append(
                {
                    "sample": name,
                    "runtime": runtime,
                    "check cos min": check["cosine"],
                    "check overlap": check["overlap"],
                    "auto takes it": "yes" if within_bound(check) else "no",
                    **held_out_agreement(want["docs"], got["docs"], want["queries"], got["queries"]),
                }
            )
    cpu, _ = cpu_identity()
    print(
        f"MiniLM ({spec.model_id}) against openvino fp32 on {cpu}; samples of {CALIBRATION_SIZE} texts; auto's check: "
        f"the first {CHECK_TEXTS} texts, bound {BOUNDS['cosine']} cosine / {BOUNDS['overlap']} overlap; held out: "
        f"{len(held_docs)} SciFact documents, {len(held_queries)} test queries (top 10)"
    )
    print(pd.DataFrame(rows).set_index(["sample", "runtime"]).to_string())


if __name__ == "__main__":
    raise SystemExit(run())
