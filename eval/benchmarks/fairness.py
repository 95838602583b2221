#!/usr/bin/env python
"""Head-of-line blocking: 1-text requests while one bulk request is being computed, over HTTP.

Starts ``litestar run`` on a free loopback port (the packaged MiniLM, and a MiniLM cross-encoder with a
seeded head for the rerank case) and measures, per case, the latency of small requests sent every
``--interval-ms`` while one bulk request is computed:

- ``passages``: a ``/v1/embeddings`` request with ``--bulk`` SciFact passages (title + text); the small
  requests are 1-text embeddings (SciFact queries). Alternated A B A B with the same bulk request alone,
  so the bulk's slowdown (the cost of fairness to it) is measured too.
- ``chunked-embed``: the largest chunked ``/v1/embeddings`` request the service's default limits admit:
  token-dense texts (punctuation and digits, about one token per character) at ``EMBEDRANK_MAX_TEXT_CHARS``,
  ``"chunking": true`` at the largest overlap admitted (half the window: every token embedded twice), as
  many as ``EMBEDRANK_MAX_REQUEST_TOKENS`` admits (sized with the model's own tokenizer and the service's
  window plan; the same request with one more short text is checked to be refused with 413). Small
  requests: 1-text embeddings.
- ``chunked-rerank``: the same for ``/v1/rerank``: one query, token-dense documents scored whole
  (``max_tokens_per_doc`` at their length) at the largest overlap, as many as the token limit admits.
  Small requests: 1-document reranks on the same model (they queue behind the bulk's windows).

It prints, per case and round, the bulk time and the small requests' p50 / p95 / p99 / max latency, then
its goals: small p50 <= 0.5 s and p99 <= 1.5 s in every case, bulk growth <= 15% (``passages``).

``--servers single fronts-2`` compares the service as one process with a replica of two front processes and an
engine process (``python -m service --fronts 2``), each started again for every round (A B A B).

    python -m eval bench fairness                               # every case (~12 minutes on 2 cores)
    python -m eval bench fairness --cases passages --bulk 256 --rounds 1
    python -m eval bench fairness --cases passages --servers single fronts-2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from eval.harness.clients import KEY, http_client, post
from eval.harness.stats import percentile

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


CASES = ("passages", "chunked-embed", "chunked-rerank")
# how each compared server runs: None, `litestar run` (one process); a number, a replica of that many front processes
SERVERS: dict[str, int | None] = {"single": None, "fronts-2": 2}
QUERY = "what causes the seasons"


def load_texts(bulk: int) -> tuple[list[str], list[str], str]:
    from embedrank.retrieval.data import default_data_dir, doc_text, load_beir

    root = default_data_dir()
    if root is not None and (root / "scifact" / "corpus.jsonl").is_file():
        ds = load_beir(root / "scifact")
        passages = [doc_text(d) for d in list(ds.corpus.values())[:bulk]]
        return passages, list(ds.queries.values()), f"SciFact: {len(passages)} passages, {len(ds.queries)} queries"
    words = "retrieval dense sparse ranking passage query vector embedding model transformer index".split()
    passages = [" ".join(words[(i + j) % len(words)] for j in range(180)) for i in range(bulk)]
    queries = [" ".join(words[(i + j) % len(words)] for j in range(8)) for i in range(200)]
    return passages, queries, "synthetic texts (no $EMBEDRANK_DATA)"


def dense_text(chars: int, seed: int) -> str:
    """Punctuation and digits, seeded: about one token per character for a WordPiece or BPE tokenizer."""
    import random

    return "".join(random.Random(seed).choices("!?.,;:()[]-+=*/#0123456789", k=chars))


def window_tokens(n_tokens: int, window: int, overlap: int, extra: int) -> int:
    """Tokens the service counts for one text of ``n_tokens`` split into windows (its request budget): each
    window's text tokens and ``extra`` more (special tokens, and a rerank query's tokens)."""
    from embedrank.models.chunking import window_starts

    return sum(min(start + window, n_tokens) - start + extra for start in window_starts(n_tokens, window, overlap))


def fill(budget: int, max_chars: int, offsets, window: int, overlap: int, extra: int) -> list[str]:
    """Token-dense texts of at most ``max_chars`` whose windows hold as many tokens as ``budget`` admits."""
    count = lambda text: window_tokens(len(offsets([text])[0]), window, overlap, extra)  # noqa: E731
    full = dense_text(max_chars, 0)
    per_text = count(full)
    texts = [dense_text(max_chars, i) for i in range(budget // per_text)]
    left = budget - sum(count(t) for t in texts)
    low, high = 0, max_chars  # the longest last text that still fits
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if count(dense_text(mid, len(texts))) <= left else (low, mid - 1)
    if low > 0:
        texts.append(dense_text(low, len(texts)))
    return texts


def worst_bodies(embed_model: str, rerank_model: str, reranker_path: str) -> dict[str, dict]:
    """The largest chunked embedding and rerank requests the default limits admit (see the module doc)."""
    from embedrank import CrossEncoder, Encoder
    from service.settings import Limits

    limits = Limits()
    encoder = Encoder.from_pretrained(MODEL, backend="torch")
    window, specials = encoder.chunk_window(), encoder.tokenizer.num_special_tokens_to_add(pair=False)
    embed_texts = fill(
        limits.max_request_tokens, limits.max_text_chars, encoder.token_offsets, window, window // 2, specials
    )
    reranker = CrossEncoder.from_pretrained(reranker_path, backend="torch")
    window = reranker.chunk_window(QUERY)
    extra = reranker.tokenizer.num_special_tokens_to_add(pair=True) + len(reranker.token_offsets([QUERY])[0])
    documents = fill(
        limits.max_request_tokens, limits.max_text_chars, reranker.token_offsets, window, window // 2, extra
    )
    documents = documents[: limits.max_documents]
    return {
        "chunked-embed": {"model": embed_model, "input": embed_texts, "chunking": True,
                          "chunk_overlap": encoder.chunk_window() // 2},
        "chunked-rerank": {"model": rerank_model, "query": QUERY, "documents": documents,
                           "chunk_overlap": window // 2, "max_tokens_per_doc": limits.max_text_chars},
    }  # fmt: skip


async def alone(base: str, route: str, body: dict) -> float:
    async with http_client(base) as client:
        return await post(client, route, body)


async def shared(base: str, route: str, body: dict, smalls: list[dict], interval: float) -> tuple[float, list[float]]:
    """The bulk request, and meanwhile one small request (``smalls`` in turn) every ``interval`` seconds."""
    async with http_client(base) as client:
        bulk = asyncio.ensure_future(post(client, route, body))
        small: list[asyncio.Future[float]] = []
        while not bulk.done():
            small.append(asyncio.ensure_future(post(client, route, smalls[len(small) % len(smalls)])))
            await asyncio.sleep(interval)
        bulk_s = await bulk
        return bulk_s, list(await asyncio.gather(*small))


async def refused(base: str, route: str, body: dict) -> int:
    async with http_client(base) as client:
        return (await client.post(route, json=body)).status_code


def describe(case: str, body: dict) -> str:
    texts = body.get("input") or body.get("documents") or []
    chars = sum(len(t) for t in texts)
    return f"{case}: {len(texts)} texts, {chars:,} characters, chunk_overlap {body.get('chunk_overlap', '-')}"


def _named(server: str, servers: list[str]) -> str:
    """The server as the report's lines name it: nothing when it is the only one compared."""
    return f"{server} " if len(servers) > 1 else ""


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--bulk", type=int, default=1024, help="passages in the passages case's bulk request (1024)")
    p.add_argument("--interval-ms", type=float, default=100.0, help="between small requests (default 100)")
    p.add_argument("--rounds", type=int, default=2, help="A B rounds of the passages case (default 2)")
    p.add_argument("--worst-rounds", type=int, default=1, help="rounds of each chunked case (default 1)")
    p.add_argument(
        "--servers", nargs="+", choices=sorted(SERVERS), default=["single"], help="compared A B A B (default: single)"
    )
    p.add_argument("--max-batch-tokens", type=int, help="server's EMBEDRANK_MAX_BATCH_TOKENS (default: its own)")
    p.add_argument(
        "--target-batch-seconds", type=float, help="server's EMBEDRANK_TARGET_BATCH_SECONDS (default: its own; 0: off)"
    )
    args = p.parse_args(argv)
    from embedrank.testing.launch import running_server
    from embedrank.testing.seeded import seeded_cross_encoder

    passages, queries, source = load_texts(args.bulk)
    reranker_path = seeded_cross_encoder()
    env = {
        "EMBEDRANK_API_KEYS": KEY,
        "HF_HUB_OFFLINE": "1",
        "EMBEDRANK_MODELS": f"{MODEL},reranker={reranker_path}",
    }
    if args.max_batch_tokens:
        env["EMBEDRANK_MAX_BATCH_TOKENS"] = str(args.max_batch_tokens)
    if args.target_batch_seconds is not None:
        env["EMBEDRANK_TARGET_BATCH_SECONDS"] = str(args.target_batch_seconds)
    print(f"inputs: {source}; one small request every {args.interval_ms:.0f} ms while the bulk request runs")
    small_embeds = [{"model": MODEL, "input": [q]} for q in queries]
    small_reranks = [{"model": "reranker", "query": q, "documents": [passages[i % len(passages)]]} for i, q in enumerate(queries)]  # fmt: skip
    worst = worst_bodies(MODEL, "reranker", reranker_path) if set(args.cases) - {"passages"} else {}
    p50s: dict[tuple[str, str], list[float]] = {}
    p99s: dict[tuple[str, str], list[float]] = {}
    alone_s: dict[str, list[float]] = {}
    shared_s: dict[str, list[float]] = {}
    for r in range(1, max(args.rounds, args.worst_rounds) + 1):
        cases = [c for c in args.cases if r <= (args.rounds if c == "passages" else args.worst_rounds)]
        for server in args.servers if cases else ():
            with running_server(env, fronts=SERVERS[server]) as base:
                asyncio.run(alone(base, "/v1/embeddings", {"model": MODEL, "input": passages[:64]}))  # warm-up
                asyncio.run(alone(base, "/v1/rerank", small_reranks[0]))
                for case in cases:
                    if case == "passages":
                        route, body, smalls = "/v1/embeddings", {"model": MODEL, "input": passages}, small_embeds
                    else:
                        route = "/v1/embeddings" if case == "chunked-embed" else "/v1/rerank"
                        body, smalls = worst[case], small_embeds if case == "chunked-embed" else small_reranks
                        key = "input" if "input" in body else "documents"
                        over = asyncio.run(refused(base, route, {**body, key: body[key] + [dense_text(300, 99)]}))
                        print(f"{describe(case, body)}; with one more 300-character text: {over}", flush=True)
                    a = asyncio.run(alone(base, route, body)) if case == "passages" else None
                    b, small = asyncio.run(shared(base, route, body, smalls, args.interval_ms / 1000))
                    p50s.setdefault((server, case), []).append(percentile(small, 50))
                    p99s.setdefault((server, case), []).append(percentile(small, 99))
                    head = f"{_named(server, args.servers)}{case} round {r}: "
                    if a is not None:
                        alone_s.setdefault(server, []).append(a)
                        shared_s.setdefault(server, []).append(b)
                        head += f"bulk alone {a:6.1f} s | shared {b:6.1f} s ({b / a - 1:+.1%}) | "
                    else:
                        head += f"bulk {b:6.1f} s | "
                    print(
                        f"{head}{len(small)} small requests: p50 {percentile(small, 50):.3f} s  p95 "
                        f"{percentile(small, 95):.3f} s  p99 {percentile(small, 99):.3f} s  max {max(small):.3f} s",
                        flush=True,
                    )
    for server in args.servers:
        name = _named(server, args.servers)
        if server in alone_s:
            alone_m, shared_m = statistics.median(alone_s[server]), statistics.median(shared_s[server])
            print(
                f"{name}passages, median over {args.rounds} rounds: bulk alone {alone_m:.1f} s "
                f"({args.bulk / alone_m:.1f} passages/s), shared {shared_m:.1f} s"
            )
        for case in args.cases:
            p50, p99 = statistics.median(p50s[server, case]), statistics.median(p99s[server, case])
            print(f"goal {name}{case}: small p50 <= 0.5 s: {p50:.3f} s {'met' if p50 <= 0.5 else 'NOT met'}")
            print(f"goal {name}{case}: small p99 <= 1.5 s: {p99:.3f} s {'met' if p99 <= 1.5 else 'NOT met'}")
        if server in alone_s:
            growth = statistics.median(shared_s[server]) / statistics.median(alone_s[server]) - 1
            print(f"goal {name}passages: bulk growth <= 15%: {growth:+.1%} {'met' if growth <= 0.15 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(run())
