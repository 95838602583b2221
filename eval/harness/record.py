"""Run a benchmark and record what it printed, with everything needed to read the figures later.

    python -m eval record NAME "Title" -- python -m eval bench encode --rounds 2

writes ``eval/results/NAME.json``: the title, the exact command, the date, the commit (and whether the
tree had uncommitted changes), the CPU's model, core count and vector flags, the versions of the
libraries that shape the figures, the wall time and what the command printed to stdout (its stderr,
progress bars and logs, goes to the terminal only). The output is also streamed to the terminal. Nothing is written when the command fails. ``eval/harness/render.py`` renders
the documentation's benchmarks page from these files.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "eval" / "results"
PACKAGES = ("torch", "transformers", "sentence-transformers", "openvino", "nncf", "onnxruntime", "faiss-cpu",
            "litestar", "uvicorn", "numpy")  # fmt: skip


def machine() -> dict:
    """The CPU's model name, logical cores, the vector flags it has (``cpus.FLAGS``), and memory."""
    from embedrank.runtime.cpus import cpu_identity, isa_limits

    model, flags = cpu_identity()
    memory = None
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        memory = round(pages * size / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "flags": flags,
        "memory_gib": memory,
        "system": f"{platform.system()} {platform.machine()}",
        # instruction-set limits set for the run (emulating an older CPU in the kernels that honour them)
        "isa_limits": isa_limits(),
    }


def gpu() -> dict | None:
    """The first CUDA GPU torch sees (name, memory, count, CUDA version), or None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "count": torch.cuda.device_count(),
        "cuda": torch.version.cuda,
    }


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def commit() -> str:
    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        except OSError:  # no git on this machine
            return ""
        return done.stdout.strip()

    sent = REPO / "build" / "gpu" / "COMMIT"  # a tree sent to a machine without its git folder says its commit
    if not git("rev-parse", "--git-dir") and sent.is_file():
        return sent.read_text(encoding="utf-8").strip()

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return head + ("+uncommitted" if git("status", "--porcelain", "--untracked-files=no") else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="result file name: eval/results/NAME.json")
    parser.add_argument("title", help="heading on the benchmarks page")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    shown = [("python" if os.path.abspath(part) == sys.executable else part) for part in command]
    started, start = dt.datetime.now(dt.UTC), time.monotonic()
    # what the benchmark prints to stdout is its result; stderr (progress bars, logs) goes to the terminal only
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        shown_last = line.rsplit("\r", 1)[-1]  # a line redrawn in place: what the terminal shows last
        if "━" not in shown_last:  # a library's progress bar printed to stdout (NNCF's) is not a result
            lines.append(shown_last)
    code = proc.wait()
    if code != 0:
        print(f"[record] {shlex.join(shown)} exited with {code}: nothing recorded", file=sys.stderr)
        return code
    record = {
        "name": args.name,
        "title": args.title,
        "command": shlex.join(shown),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "seconds": round(time.monotonic() - start, 1),
        "machine": {**machine(), **({"gpu": found} if (found := gpu()) else {})},
        "versions": versions(),
        "output": "".join(lines).rstrip() + "\n",
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{args.name}.json"
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"[record] wrote {path.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
