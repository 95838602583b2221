"""``python -m eval``: run a benchmark by name, record it, render the pages (see ``eval/__init__.py``)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from eval.benchmarks import REGISTRY, Benchmark

REPO = Path(__file__).resolve().parents[1]
AS_AVX2 = REPO / "tests" / "as_avx2.sh"


def listing() -> str:
    width = max(map(len, REGISTRY))
    return "\n".join(f"{b.name:<{width}}  {b.about or b.title}" for b in REGISTRY.values())


def find(name: str) -> Benchmark:
    if name not in REGISTRY:
        raise SystemExit(f"no benchmark named {name!r}; python -m eval bench --list names them:\n{listing()}")
    return REGISTRY[name]


def held_to_avx2() -> bool:
    """Whether this process runs under ``tests/as_avx2.sh`` (which caps oneDNN, among others, to AVX2)."""
    return os.environ.get("ONEDNN_MAX_CPU_ISA") == "AVX2"


def again_as_avx2(argv: list[str]) -> None:
    """This command again under ``tests/as_avx2.sh``: kernels held to AVX2, and the record's CPU flags with them."""
    os.execv(str(AS_AVX2), [str(AS_AVX2), sys.executable, "-m", "eval", *argv])


def bench(benchmark: Benchmark, args: list[str]) -> int:
    """``benchmark``'s entry point in this process, with ``args`` (its recorded arguments when none)."""
    entry = getattr(importlib.import_module(benchmark.module), benchmark.entry)
    return int(entry(list(args or benchmark.args)) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m eval", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("bench", help="run a benchmark by name, printing its figures (no record)")
    one.add_argument("name", nargs="?", help="the benchmark (--list names them)")
    one.add_argument("--list", action="store_true", help="every benchmark's name and what it measures")
    kept = commands.add_parser("record", help="run a benchmark through the recorder into eval/results/, then render")
    kept.add_argument("name", nargs="?", help="the benchmark; or any name, with --title and the command after --")
    kept.add_argument("--title", help="for a command of your own: the heading on the benchmarks page")
    rendered = commands.add_parser("render", help="the docs' benchmark pages from eval/results/")
    rendered.add_argument("--check", action="store_true", help="exit 1 if a page is not what the files render to")
    args, rest = parser.parse_known_args(argv)
    if args.command != "record" or args.title is None:  # a benchmark's own arguments may follow a --
        rest = rest[1:] if rest[:1] == ["--"] else rest

    if args.command == "render":
        from eval.harness import render

        return render.main(["--check"] if args.check else [])
    if args.command == "bench":
        if args.list or not args.name:
            print(listing())
            return 0 if args.list else 2
        benchmark = find(args.name)
        if benchmark.avx2 and not held_to_avx2():
            again_as_avx2(argv)
        return bench(benchmark, rest)

    from eval.harness import record, render

    if not args.name:
        print(f"name a benchmark to record:\n{listing()}", file=sys.stderr)
        return 2
    if args.title is not None:  # a command of one's own: record NAME --title TITLE -- COMMAND...
        return record.main([args.name, args.title, *rest]) or render.main([])
    benchmark = find(args.name)
    if benchmark.avx2 and not held_to_avx2():
        again_as_avx2(argv)
    command = [sys.executable, "-m", "eval", "bench", benchmark.name, *rest]
    return record.main([benchmark.name, benchmark.title, "--", *command]) or render.main([])


if __name__ == "__main__":
    sys.exit(main())
