"""The support matrix: every architecture on every backend and precision, checked against sentence-transformers.

    python -m eval bench support                                   # every architecture and system
    python -m eval bench support --systems torch:fp32 onnx:fp32 --architectures bert mpnet

For each architecture it builds the tiny seeded model (:mod:`embedrank.testing.tiny`: 2 layers, hidden 64,
the architecture's own tokenizer kind and padding side), loads it with embedrank on each system
(``backend:precision``) and with sentence-transformers on torch, and prints one Markdown table row:

- **parity**: the largest absolute difference of the embeddings (after pooling and normalization) or the
  cross-encoder scores, over texts that include Unicode, a one-character text and a text cut at the max
  length; bf16 and int8 rows give the smallest cosine to sentence-transformers' embedding instead (cross-encoders:
  Spearman's rank correlation with sentence-transformers' scores over the 256 speed texts, since int8 is
  judged by the order it ranks in);
- **tokens**: whether every text's token count equals sentence-transformers';
- **export s**: seconds of the first export (from the export's ``export.json``), ``cached`` if it was made
  before, ``-`` on torch;
- **llm-reranker** rows (a causal LM scored by P(yes), as Qwen3-Reranker's card does) are checked against the
  card's recipe written with plain transformers (:mod:`embedrank.testing.model_cards`) instead of
  sentence-transformers, for scores, token counts and speed;
- **speed**: texts per second of embedrank over sentence-transformers (torch fp32) on the same 256 texts,
  the median of alternated rounds. The models are tiny, so this shows regressions, not what a real model gains;
- **status**: ``parity`` when the figure is within the bound (1e-5 torch, 1e-4 exported fp32), ``bf16 ok`` /
  ``int8 ok`` within theirs (bf16: cosine >= 0.99, rank correlation >= 0.95; int8: 0.95 and 0.9), ``runs on torch: <reason>`` when the backend fell back, else ``FAIL``.

The exit status is 1 when any row fails; nothing raises. Record it with ``make bench NAME=support``; the docs'
page of supported models is rendered from the record.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

REPO = Path(__file__).resolve().parents[2]

from embedrank import CrossEncoder, Encoder  # noqa: E402
from embedrank.testing.architectures import ARCHITECTURES, CROSS_ENCODERS  # noqa: E402
from embedrank.testing.model_cards import load_qwen3_reranker, qwen3_reranker_scores  # noqa: E402
from embedrank.testing.tiny import tiny_model  # noqa: E402
from embedrank.texts import vocabulary_texts  # noqa: E402

SYSTEMS = ("torch:fp32", "openvino:fp32", "onnx:fp32", "openvino:bf16", "openvino:int8", "onnx:int8")
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "green tea health benefits",
    "Ünïcödé: les saisons sont causées par l'inclinaison de la Terre. 季節",
    "retrieval " * 150,
    "x",
]
QUERY = "what are the health benefits of green tea"
BOUND = {"torch": 1e-5, "fp32": 1e-4, "bf16-cosine": 0.99, "bf16-rho": 0.95, "int8-cosine": 0.95, "int8-rho": 0.9}


def _export_seconds(model: Encoder | CrossEncoder, before: float) -> str:
    path = getattr(model.runtime, "path", None)
    if path is None:
        return "-"
    info = json.loads((Path(path).parent / "export.json").read_text())
    made = (Path(path).parent / "export.json").stat().st_mtime
    return f"{info['export_seconds']:.1f}" if made >= before else "cached"


def _speed(ours, theirs, rounds: int) -> float:
    """Median over alternated rounds of (our rate / their rate)."""
    ratios = []
    for _ in range(rounds):
        started = time.perf_counter()
        theirs()
        reference = time.perf_counter() - started
        started = time.perf_counter()
        ours()
        ratios.append(reference / (time.perf_counter() - started))
    return statistics.median(ratios)


def _load(cls, path: str, backend: str, precision: str, calibration: list[str]):
    options = {"backend": backend, "precision": precision}
    if precision == "int8":
        options["calibration"] = calibration
    return cls.from_pretrained(path, **options)


def embedding_row(name: str, system: str, texts: list[str], rounds: int, reference: dict) -> dict:
    from sentence_transformers import SentenceTransformer

    backend, precision = system.split(":")
    path = tiny_model(name)
    if ("embedding", name) not in reference:
        st = SentenceTransformer(path, device="cpu")
        counts = st.tokenize(TEXTS)["attention_mask"].sum(dim=1).tolist()
        reference["embedding", name] = (st, st.encode(TEXTS), counts)
    st, expected, st_counts = reference["embedding", name]
    started = time.time()
    enc = _load(Encoder, path, backend, precision, texts)
    out = enc.encode_with_stats(TEXTS, batch_size=2)
    if precision in ("bf16", "int8"):
        cosines = (out.embeddings * expected).sum(axis=1) / (
            np.linalg.norm(out.embeddings, axis=1) * np.linalg.norm(expected, axis=1)
        )
        figure, ok = float(cosines.min()), float(cosines.min()) >= BOUND[f"{precision}-cosine"]
        shown = f"cos {figure:.4f}"
    else:
        figure = float(np.abs(out.embeddings - expected).max())
        ok = figure <= BOUND["torch" if backend == "torch" else "fp32"]
        shown = f"{figure:.1e}"
    speed = _speed(lambda: enc.encode(texts, batch_size=32), lambda: st.encode(texts, batch_size=32), rounds)
    return _row(name, "embedding", system, enc, shown, ok, out.token_counts == st_counts, started, speed)


def cross_encoder_row(name: str, system: str, texts: list[str], rounds: int, reference: dict) -> dict:
    from sentence_transformers import CrossEncoder as STCrossEncoder

    backend, precision = system.split(":")
    path = tiny_model(name, "cross-encoder")
    pairs = [(QUERY, t) for t in TEXTS]
    if ("cross-encoder", name) not in reference:
        st = STCrossEncoder(path, device="cpu")
        reference["cross-encoder", name] = (st, st.predict(pairs))
    st, expected = reference["cross-encoder", name]
    started = time.time()
    ce = _load(CrossEncoder, path, backend, precision, texts)
    out = ce.score_pairs_with_stats(pairs, batch_size=2)
    many = [(QUERY, t) for t in texts]
    if precision in ("bf16", "int8"):  # judged by the order it ranks in: Spearman's rho over all the texts
        if ("cross-encoder-ranking", name) not in reference:
            reference["cross-encoder-ranking", name] = st.predict(many, batch_size=32)
        rho = float(spearmanr(ce.score_pairs(many, batch_size=32), reference["cross-encoder-ranking", name])[0])
        shown, ok = f"rho {rho:.3f}", rho >= BOUND[f"{precision}-rho"]
    else:
        figure = float(np.abs(out.scores - expected).max())
        shown, ok = f"{figure:.1e}", figure <= BOUND["torch" if backend == "torch" else "fp32"]
    speed = _speed(lambda: ce.score_pairs(many, batch_size=32), lambda: st.predict(many, batch_size=32), rounds)
    counts = st.tokenizer([QUERY] * len(TEXTS), TEXTS, truncation=True, max_length=st.max_length)["input_ids"]
    tokens_equal = out.token_counts == [len(ids) for ids in counts]
    return _row(name, "cross-encoder", system, ce, shown, ok, tokens_equal, started, speed)


LLM_RERANKERS = {"qwen3": "Qwen3-Reranker-0.6B/4B/8B (causal-LM form, the model card's yes/no recipe)"}
"""Decoders built as causal-LM rerankers, checked against their model card's recipe (not sentence-transformers)."""


def llm_reranker_row(name: str, system: str, texts: list[str], rounds: int, reference: dict) -> dict:
    backend, precision = system.split(":")
    path = tiny_model(name, "causal-lm")
    pairs = [(QUERY, t) for t in TEXTS]
    started = time.time()
    ce = _load(CrossEncoder, path, backend, precision, texts)
    if ("llm-reranker", name) not in reference:
        card = load_qwen3_reranker(path)
        reference["llm-reranker", name] = (card, qwen3_reranker_scores(path, pairs, ce.max_seq_length, loaded=card))
    card, expected = reference["llm-reranker", name]
    out = ce.score_pairs_with_stats(pairs, batch_size=2)
    many = [(QUERY, t) for t in texts]

    def by_card() -> np.ndarray:
        return np.concatenate(
            [
                qwen3_reranker_scores(path, many[i : i + 32], ce.max_seq_length, loaded=card)
                for i in range(0, len(many), 32)
            ]
        )

    if precision in ("bf16", "int8"):
        rho = float(spearmanr(ce.score_pairs(many, batch_size=32), by_card())[0])
        shown, ok = f"rho {rho:.3f}", rho >= BOUND[f"{precision}-rho"]
    else:
        figure = float(np.abs(out.scores - expected).max())
        shown, ok = f"{figure:.1e}", figure <= BOUND["torch" if backend == "torch" else "fp32"]
    speed = _speed(lambda: ce.score_pairs(many, batch_size=32), by_card, rounds)
    counts = ce.tokenizer([QUERY] * len(TEXTS), TEXTS, truncation=True, max_length=ce.max_seq_length)["input_ids"]
    card_counts = card[0](  # the card's own count: prefix + body cut at the room left + suffix
        [ce.tokenizer.format(QUERY, t) for t in TEXTS],
        truncation=True,
        max_length=ce.max_seq_length - len(ce.tokenizer.prefix_ids) - len(ce.tokenizer.suffix_ids),
    )["input_ids"]
    tokens_equal = (
        out.token_counts
        == [len(ids) for ids in counts]
        == [len(ids) + len(ce.tokenizer.prefix_ids) + len(ce.tokenizer.suffix_ids) for ids in card_counts]
    )
    return _row(name, "llm-reranker", system, ce, shown, ok, tokens_equal, started, speed)


def _row(name, kind, system, model, shown, ok, tokens_equal, started, speed) -> dict:
    backend = system.split(":")[0]
    if model.backend != backend:
        status = f"runs on torch: {getattr(model, 'fallback_reason', 'export failed')}"
    else:
        precision = system.split(":")[1]
        status = (f"{precision} ok" if precision in ("bf16", "int8") else "parity") if ok and tokens_equal else "FAIL"
    return {
        "architecture": name,
        "kind": kind,
        "system": system,
        "parity": shown,
        "tokens": "equal" if tokens_equal else "DIFFER",
        "export": _export_seconds(model, started),
        "speed": f"{speed:.2f}x",
        "status": status,
    }


@contextlib.contextmanager
def _stdout_to_stderr():
    """Send file descriptor 1 (and ``sys.stdout``) to stderr, so only the table reaches stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _cell(row: dict) -> str:
    if row["status"] in ("parity", "bf16 ok", "int8 ok"):
        return f"{row['status']} ({row['parity']})"
    return row["status"].replace("|", "/")


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), help="backend:precision pairs")
    parser.add_argument("--architectures", nargs="+", default=list(ARCHITECTURES))
    parser.add_argument("--kinds", nargs="+", default=["embedding", "cross-encoder", "llm-reranker"])
    parser.add_argument("--rounds", type=int, default=2, help="alternated speed rounds (median)")
    parser.add_argument("--texts", type=int, default=256, help="texts per speed round")
    args = parser.parse_args(argv)
    logging.getLogger("embedrank").setLevel(logging.ERROR)  # export notices go to stderr; the table is the output
    warnings.filterwarnings("ignore")
    from transformers import AutoTokenizer

    texts = vocabulary_texts(AutoTokenizer.from_pretrained(tiny_model("bert")).get_vocab(), n=args.texts)
    rows, reference = [], {}
    jobs = [("embedding", a) for a in args.architectures if "embedding" in args.kinds]
    jobs += [("cross-encoder", a) for a in args.architectures if "cross-encoder" in args.kinds and a in CROSS_ENCODERS]
    jobs += [("llm-reranker", a) for a in args.architectures if "llm-reranker" in args.kinds and a in LLM_RERANKERS]
    for kind, name in jobs:
        for system in args.systems:
            build = {"embedding": embedding_row, "cross-encoder": cross_encoder_row, "llm-reranker": llm_reranker_row}[
                kind
            ]
            try:  # what libraries print (NNCF's progress bars, exporters' blank lines) goes to stderr
                with _stdout_to_stderr():
                    rows.append(build(name, system, texts, args.rounds, reference))
            except Exception as exc:  # a row that fails is a finding, reported in its row
                reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}"
                rows.append(
                    {
                        "architecture": name,
                        "kind": kind,
                        "system": system,
                        "parity": "-",
                        "tokens": "-",
                        "export": "-",
                        "speed": "-",
                        "status": f"FAIL ({reason})",
                    }
                )
            print(f"[support] {kind} {name} {system}: {rows[-1]['status']}", file=sys.stderr, flush=True)
    print("| architecture | kind | public models of it | " + " | ".join(args.systems) + " |")
    print("|---|---|---|" + "---|" * len(args.systems))
    for kind, name in jobs:
        cells = {r["system"]: r for r in rows if (r["kind"], r["architecture"]) == (kind, name)}
        shown = [_cell(cells[system]) for system in args.systems]
        arch = ARCHITECTURES[name]
        examples = ", ".join(
            {"embedding": arch.examples, "cross-encoder": arch.rerankers}.get(kind, (LLM_RERANKERS.get(name, ""),))
        )
        print(f"| {name} | {kind} | {examples} | " + " | ".join(shown) + " |")
    print("\n| architecture | kind | backend:precision | parity | tokens | export s | speed vs ST | status |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['architecture']} | {r['kind']} | {r['system']} | {r['parity']} | {r['tokens']} | "
            f"{r['export']} | {r['speed']} | {r['status']} |"
        )
    failed = [r for r in rows if r["status"].startswith("FAIL")]
    print(
        f"\n{len(rows) - len(failed)} of {len(rows)} rows within their bound or falling back with a reason; {len(failed)} failed."
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run())
