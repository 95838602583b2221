"""``backend="auto", precision="auto"`` started on a busy machine: does the runtime it ends with encode as fast as
the one it chooses on a quiet machine?

The packaged MiniLM, its exports cached (only the decision, ``exports/*-auto-auto-*.json``, is removed before
each start). First the quiet choice: a start on the quiet machine. Then ``--starts`` times: the decision removed,
a start with ``--busy`` busy loops (processes spinning) beside it, its decision printed (provisional or not); the
loops stopped, and the next load on the quiet machine, which measures a provisional decision again (a server does
it in the background once idle): the final choice. Each load runs in a process of its own. Last, each final
choice's runtime and the quiet choice's encode ``--passages`` SciFact passages (the packaged sample's texts when
SciFact is not in the data directory), alternated A B A B over ``--rounds`` rounds: passages per second, and the
final choice's speed as a share of the quiet choice's (goal: at least 90%).

    python -m eval bench auto-load                 # about 15 minutes on 2 cores

It removes the packaged MiniLM's cached ``auto`` decision before each start and at the end (the next load
measures again).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

LOAD = """
import json, logging
from embedrank import Encoder
encoder = Encoder.from_pretrained(backend="auto", precision="auto")
c = encoder.auto_choice
print(json.dumps({"runtime": f"{c.backend} {c.precision}", "confident": c.confident, "doubt": c.doubt,
                  "others_busy": c.others_busy, "cached": c.cached, "remeasured": c.remeasured}))
"""


def spin() -> None:
    while True:
        pass


def forget_decisions() -> int:
    """Remove the packaged MiniLM's cached ``auto`` decisions (its exports stay); how many there were."""
    from embedrank.paths import default_cache_dir

    found = list((default_cache_dir() / "exports").glob("*-auto-auto-*.json"))
    for path in found:
        path.unlink()
    return len(found)


def load(busy: int) -> dict:
    """A start in a process of its own, with ``busy`` busy loops beside it: what ``auto`` decided."""
    loops = [multiprocessing.Process(target=spin, daemon=True) for _ in range(busy)]
    for loop in loops:
        loop.start()
    try:
        time.sleep(1 if busy else 0)
        done = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, check=True)
    finally:
        for loop in loops:
            loop.kill()
            loop.join()
    return json.loads(done.stdout.strip().splitlines()[-1])


def passages(n: int) -> tuple[list[str], str]:
    from embedrank.retrieval.data import default_data_dir, doc_text, load_beir
    from embedrank.texts import packaged_sample

    root = default_data_dir()
    if root is not None and (root / "scifact" / "corpus.jsonl").is_file():
        docs = list(load_beir(root / "scifact").corpus.values())
        return [doc_text(d) for d in docs[:n]], "SciFact passages"
    return list(packaged_sample())[:n], "the packaged sample's texts"


def speeds(runtimes: list[str], texts: list[str], rounds: int) -> dict[str, float]:
    """Passages per second of each runtime (``"backend precision"``), alternated, the median of ``rounds``."""
    from embedrank import Encoder

    encoders = {r: Encoder.from_pretrained(backend=r.split()[0], precision=r.split()[1]) for r in runtimes}
    for encoder in encoders.values():
        encoder.encode(texts[:64], batch_size=32)
    rates: dict[str, list[float]] = {r: [] for r in runtimes}
    for _ in range(rounds):
        for name, encoder in encoders.items():
            started = time.perf_counter()
            encoder.encode(texts, batch_size=32)
            rates[name].append(len(texts) / (time.perf_counter() - started))
    return {name: statistics.median(values) for name, values in rates.items()}


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--starts", type=int, default=3)
    p.add_argument("--busy", type=int, default=2, help="busy loops beside each start (default 2)")
    p.add_argument("--passages", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    forget_decisions()
    quiet = load(0)
    busy_share = f"others used {quiet['others_busy']:.0%} of the CPU"
    print(f"quiet start: auto chose {quiet['runtime']} (confident: {quiet['confident']}, {busy_share})")
    finals = []
    print(f"\n| start | with {args.busy} busy loops | provisional because | next load, quiet | final |")
    print("|---|---|---|---|---|")
    for start in range(1, args.starts + 1):
        forget_decisions()
        busy = load(args.busy)
        after = load(0)
        finals.append(after["runtime"])
        again = "measured again" if after["remeasured"] else ("read the cache" if after["cached"] else "measured")
        first = f"{busy['runtime']} (others {busy['others_busy']:.0%})"
        print(f"| {start} | {first} | {busy['doubt'] or 'confident'} | {again} | {after['runtime']} |")
    texts, what = passages(args.passages)
    rate = speeds(sorted({quiet["runtime"], *finals}), texts, args.rounds)
    print(f"\n{len(texts)} {what}, batch 32, {args.rounds} rounds alternated: passages/s")
    for name, value in sorted(rate.items()):
        print(f"- {name}: {value:.1f}")
    shares = [rate[final] / rate[quiet["runtime"]] for final in finals]
    worst = min(shares)
    print(
        f"goal every final choice >= 90% of the quiet choice's speed: {worst:.0%} {'met' if worst >= 0.9 else 'NOT met'}"
    )
    forget_decisions()
    return 0


if __name__ == "__main__":
    sys.exit(run())
