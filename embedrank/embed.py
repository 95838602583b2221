"""``python -m embedrank.embed COLLECTION --output OUT``: embed a BEIR corpus into parquet shards and a
manifest (:mod:`embedrank.retrieval.embed_job`). Rerunning the same command resumes an interrupted job.

Only the local runner exists so far (one process, streaming); the Ray runner of issue 15 is not built yet.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m embedrank.embed", description=__doc__)
    p.add_argument("collection", help="BEIR collection name (in --data-dir) or path, or a corpus.jsonl")
    p.add_argument("--output", required=True, help="directory for the shards and the manifest")
    p.add_argument("--data-dir", help="directory holding BEIR collections (default: $EMBEDRANK_DATA or ../shared/data)")
    p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2", help="embedding model id or path")
    p.add_argument("--runner", choices=["local"], default="local", help="where the encoding runs (local only so far)")
    p.add_argument("--shard-size", type=int, default=10_000, help="documents per parquet shard (default: 10000)")
    p.add_argument("--batch-size", type=int, default=64, help="encoding batch size (default: 64)")
    args = p.parse_args(argv)

    from pathlib import Path

    from embedrank.errors import EmbedrankError
    from embedrank.models.encoder import Encoder
    from embedrank.retrieval.data import resolve_dataset
    from embedrank.retrieval.embed_job import embed_collection

    try:
        source = Path(args.collection)
        corpus = source if source.is_file() else resolve_dataset(args.collection, args.data_dir)
        result = embed_collection(
            Encoder.from_pretrained(args.model),
            corpus,
            args.output,
            shard_size=args.shard_size,
            batch_size=args.batch_size,
        )
    except EmbedrankError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"{result.documents} documents in {result.directory}: {result.shards_written} shards written, "
        f"{result.shards_reused} reused from an earlier run"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
