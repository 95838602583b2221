"""Get the collections the evaluation harness reads: fetch a BEIR collection by name, or build one BEIR does
not host from its original files. Collections go to the data directory (``--data-dir``, else
``$EMBEDRANK_DATA``, else ``~/.local/share/embedrank``), where ``eval/run.py`` finds them by name.

    python eval/get_data.py list                          # what the data directory holds, and what can be added
    python eval/get_data.py fetch scifact                 # BEIR, from the Hugging Face hub (online)
    python eval/get_data.py convert cranfield ~/Downloads/cran        # cran.all.1400, cran.qry, cranqrel
    python eval/get_data.py convert medline ~/Downloads/med           # MED.ALL, MED.QRY, MED.REL
    python eval/get_data.py convert adi ~/Downloads/adi               # ADI.ALL, ADI.QRY, ADI.REL
    python eval/get_data.py convert nfcorpus ~/Downloads/nfcorpus --queries nfcorpus-test-queries.tsv
    python eval/get_data.py convert trec-dl --collection collection.tsv --queries msmarco-test2019-queries.tsv \\
        --qrels 2019qrels-pass.txt --run run.dl19-passage.bm25.txt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_NAMES = {
    "cranfield": "cranfield",
    "medline": "medline",
    "adi": "adi",
    "nfcorpus": "nfcorpus-preprocessed-partial",
    "trec-dl": "trec-dl19-passage-bm25top100",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data-dir", help="where collections go (default: $EMBEDRANK_DATA, else ~/.local/share/embedrank)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the collections in the data directory, and those that can be added")
    fetch = commands.add_parser("fetch", help="download a BEIR collection from the Hugging Face hub")
    fetch.add_argument("name")
    convert = commands.add_parser("convert", help="build a collection from its original files")
    convert.add_argument("kind", choices=sorted(DEFAULT_NAMES))
    convert.add_argument(
        "source", nargs="?", help="the folder of the original files (cranfield, medline, adi, nfcorpus)"
    )
    convert.add_argument("--name", help="the collection's name in the data directory (default: the usual one)")
    convert.add_argument("--queries", help="nfcorpus: test queries (id<TAB>text); trec-dl: the year's queries")
    convert.add_argument("--collection", help="trec-dl: MS MARCO's collection.tsv")
    convert.add_argument("--qrels", help="trec-dl: the year's TREC qrels")
    convert.add_argument("--run", help="trec-dl: the first-stage TREC run to rerank")
    convert.add_argument("--depth", type=int, default=100, help="trec-dl: passages per query kept from the run")
    return parser


def describe(root: Path) -> str:
    from embedrank.retrieval.data import load_beir

    data = load_beir(root)
    judged = sum(map(len, data.qrels.values()))
    return f"{root}: {len(data.corpus)} documents, {len(data.queries)} judged test queries, {judged} judgments"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from embedrank.paths import default_data_dir
    from embedrank.retrieval import sources
    from embedrank.retrieval.data import CONVERTED

    data_dir = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir()
    if args.command == "list":
        present = sorted(p.name for p in data_dir.glob("*") if (p / "corpus.jsonl").is_file())
        print(f"data directory: {data_dir}" + ("" if data_dir.is_dir() else " (does not exist yet)"))
        print("holds: " + (", ".join(present) if present else "no collection"))
        print("BEIR collections (python eval/get_data.py fetch NAME): " + ", ".join(sources.BEIR_COLLECTIONS))
        for name, how in CONVERTED.items():
            print(f"{name}: {how}")
        return 0
    if args.command == "fetch":
        try:
            root = sources.fetch_beir(args.name, data_dir)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except Exception as exc:  # the hub unreachable, or its layout changed: the zip BEIR hosts is the other way
            from embedrank.retrieval.data import BEIR_URL

            print(
                f"error: could not fetch BeIR/{args.name} from the Hugging Face hub ({type(exc).__name__}: {exc}).\n"
                f"BEIR also hosts it as {BEIR_URL.format(name=args.name)}: unzip it into {data_dir}.",
                file=sys.stderr,
            )
            return 1
        print(f"fetched BEIR {args.name} from the Hugging Face hub (BeIR/{args.name}, BeIR/{args.name}-qrels)")
        print(describe(root))
        return 0
    out = data_dir / (args.name or DEFAULT_NAMES[args.kind])
    try:
        if args.kind in sources.SMART_COLLECTIONS:
            if not args.source:
                raise ValueError(f"name the folder that holds the {args.kind} files")
            root = sources.convert_smart(args.kind, args.source, out)
        elif args.kind == "nfcorpus":
            if not (args.source and args.queries):
                raise ValueError("nfcorpus needs the release folder and --queries")
            root = sources.convert_nfcorpus(args.source, args.queries, out)
        else:
            needed = {
                "--collection": args.collection,
                "--queries": args.queries,
                "--qrels": args.qrels,
                "--run": args.run,
            }
            missing = [flag for flag, value in needed.items() if not value]
            if missing:
                raise ValueError(f"trec-dl needs {', '.join(missing)}")
            root = sources.convert_trec_dl(args.collection, args.queries, args.qrels, args.run, out, depth=args.depth)
    except (ValueError, OSError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"converted {args.kind} into BEIR layout ({root / 'SOURCE.txt'} says from what)")
    print(describe(root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
