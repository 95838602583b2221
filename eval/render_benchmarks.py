"""Render the documentation's benchmarks page from the result files ``eval/record.py`` writes.

    python eval/render_benchmarks.py            # writes docs/benchmarks.md
    python eval/render_benchmarks.py --check    # exit 1 if docs/benchmarks.md is not what the files render to

Each result is shown with its command, date, commit, CPU (model, cores, vector flags) and library
versions, then what the benchmark printed. No figure reaches the page any other way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "eval" / "results"
PAGE = REPO / "docs" / "benchmarks.md"
# the order of the page; results not named here follow, by name
ORDER = ("quality", "quality-dl19", "quantization", "encode", "rerank", "service", "fairness", "load", "embed-job")

INTRO = """# Benchmarks

Every figure on this page was produced by the command shown with it and recorded by `eval/record.py`
into `eval/results/`; this page is rendered from those files by `eval/render_benchmarks.py`, and the
test suite checks that it is. Speed depends on the CPU: each result names the CPU it ran on and its
vector flags (AVX-512, VNNI and BF16 change which kernels run), and a speed figure holds only for that
kind of CPU. Speed benchmarks alternate the systems they compare (A B A B) and quote medians and ratios
measured side by side in one run, because a shared machine's speed drifts within minutes. Quality
figures (nDCG, recall) do not depend on the CPU for fp32.

To measure on your machine, run the `make` target named with each result (`make bench` runs the speed
benchmarks, `make eval` the reference evaluations); each writes its result file, then
`python eval/render_benchmarks.py` renders this page.
"""


def load_results(directory: Path = RESULTS) -> list[dict]:
    results = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(directory.glob("*.json"))]
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(results, key=lambda r: (rank.get(r["name"], len(ORDER)), r["name"]))


def cpu_line(machine: dict) -> str:
    flags = ", ".join(machine.get("flags") or []) or "no AVX flags read"
    return f"{machine.get('cpu', 'unknown CPU')}, {machine.get('cores')} cores ({flags})"


def render(results: list[dict]) -> str:
    parts = [INTRO]
    if not results:
        parts.append("\nNo results are recorded yet.\n")
    machines = sorted({cpu_line(r["machine"]) for r in results})
    if machines:
        parts.append("\n## Machines\n\n" + "\n".join(f"- {m}" for m in machines) + "\n")
    for r in results:
        versions = ", ".join(f"{k} {v}" for k, v in r["versions"].items())
        parts.append(
            f"\n## {r['title']}\n\n"
            f"- command: `{r['command']}`\n"
            f"- date: {r['date']}, commit `{r['commit']}`, {r['seconds']:g} s\n"
            f"- CPU: {cpu_line(r['machine'])}, {r['machine'].get('memory_gib')} GiB\n"
            f"- versions: {versions}\n\n"
            f"```text\n{r['output'].rstrip()}\n```\n"
        )
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    page = render(load_results())
    if args.check:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != page:
            print(f"{PAGE.relative_to(REPO)} is not what eval/results renders to: run eval/render_benchmarks.py")
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(REPO)} from {len(load_results())} result files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
