"""``python -m embedrank.embed COLLECTION --output OUT``: embed a BEIR corpus into parquet shards and a
manifest (:mod:`embedrank.retrieval.embed_job`). Rerunning the same command resumes an interrupted job.

``--runner local`` (default) encodes in this process, streaming; ``--runner ray`` runs the encoding on Ray
Data with an actor pool (:mod:`embedrank.retrieval.embed_ray`; needs ``pip install 'embedrank[ray]'``): on a
local Ray instance, or on a cluster with ``--address`` (``auto`` inside a ``ray job submit`` job). Both write
the same output and either can resume the other's job.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m embedrank.embed", description=__doc__)
    p.add_argument("collection", help="BEIR collection name (in --data-dir) or path, or a corpus .jsonl/.parquet")
    p.add_argument("--output", required=True, help="directory for the shards and the manifest")
    p.add_argument(
        "--data-dir",
        help="directory holding BEIR collections (default: $EMBEDRANK_DATA, else ~/.local/share/embedrank)",
    )
    p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2", help="embedding model id or path")
    p.add_argument("--runner", choices=["local", "ray"], default="local", help="where the encoding runs")
    p.add_argument("--shard-size", type=int, default=10_000, help="documents per parquet shard (default: 10000)")
    p.add_argument("--batch-size", type=int, default=64, help="encoding batch size (default: 64)")
    p.add_argument(
        "--device",
        default="cpu",
        help="where the encoding runs: cpu (default), cuda (Ray: one GPU per actor), cuda:<index> (local runner), "
        "or auto (a GPU where there is one)",
    )
    ray = p.add_argument_group("ray runner")
    ray.add_argument("--address", help="Ray cluster address ('auto': the cluster this machine belongs to)")
    ray.add_argument(
        "--concurrency", type=int, help="encoder actors (default: one per CPU the cluster has free; one per GPU)"
    )
    ray.add_argument(
        "--num-cpus",
        type=float,
        help="CPUs per actor, also its torch threads (default: the free CPUs shared; 1 with GPUs)",
    )
    ray.add_argument("--read-cpus", type=float, default=0.25, help="CPUs per read/parse task (default: 0.25)")
    ray.add_argument("--rows-per-call", type=int, default=128, help="documents per actor call (default: 128)")
    args = p.parse_args(argv)

    from pathlib import Path

    from embedrank.errors import EmbedrankError
    from embedrank.retrieval.data import resolve_dataset

    try:
        source = Path(args.collection)
        corpus = source if source.is_file() else resolve_dataset(args.collection, args.data_dir)
        if args.runner == "ray":
            from embedrank.retrieval.embed_ray import embed_collection_ray

            result = embed_collection_ray(
                args.model,
                corpus,
                args.output,
                shard_size=args.shard_size,
                batch_size=args.batch_size,
                rows_per_call=args.rows_per_call,
                concurrency=args.concurrency,
                num_cpus=args.num_cpus,
                read_cpus=args.read_cpus,
                address=args.address,
                device=args.device,
            )
        else:
            from embedrank.models.encoder import Encoder
            from embedrank.retrieval.embed_job import embed_collection

            result = embed_collection(
                Encoder.from_pretrained(args.model, device=args.device),
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
