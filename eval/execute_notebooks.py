"""Execute the notebooks in place, in full mode, with the inline backend, so the committed outputs carry
every table and figure a reader expects (``make notebooks``).

    python eval/execute_notebooks.py                   # all of them
    python eval/execute_notebooks.py notebooks/03_evaluation.ipynb
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]


def run_notebook(path: Path, env: dict[str, str] | None = None, timeout: int = 1800) -> nbformat.NotebookNode:
    """Execute the notebook at ``path`` (in its folder, with the inline matplotlib backend, so figures
    become outputs) with ``env`` added to the environment; return it with its outputs (not written)."""
    nb = nbformat.read(path, as_version=4)
    saved = os.environ.copy()
    os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend turns figures into outputs
    os.environ.pop("EMBEDRANK_NOTEBOOK_QUICK", None)
    os.environ.update(env or {})
    try:
        NotebookClient(
            nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
        ).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return nb


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted((REPO / "notebooks").glob("*.ipynb"))
    for path in paths:
        start = time.monotonic()
        nbformat.write(run_notebook(path), path)
        print(f"{path.name}: executed in {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
