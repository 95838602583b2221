"""Sources of texts that are not a collection: a file of texts, and seeded pseudo-sentences drawn from a
model's own vocabulary (needs no data, the same on every machine). Both the int8 export of a runtime and the
int8/uint8 ranges of an encoder's vectors are computed on texts from here when the user names none.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from embedrank.errors import InvalidInputError

DEFAULT_TEXTS = 1000
_WORD = re.compile(r"[a-z]{3,}")


def vocabulary_texts(
    vocabulary: Iterable[str], *, n: int = DEFAULT_TEXTS, min_words: int = 8, max_words: int = 64, seed: int = 0
) -> list[str]:
    """``n`` pseudo-sentences of ``min_words`` to ``max_words`` words drawn (seeded) from the whole
    alphabetic words of ``vocabulary``.

    >>> vocabulary_texts(["apple", "##s", "pear", "a", "plum"], n=2, min_words=2, max_words=3)
    ['pear apple apple', 'apple apple apple']
    """
    words = sorted({w for w in vocabulary if _WORD.fullmatch(w)})
    if not words:
        raise InvalidInputError("the vocabulary has no whole words to build calibration texts from")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_words, max_words + 1, size=n)
    return [" ".join(words[i] for i in rng.integers(0, len(words), size=k)) for k in lengths]


def read_texts(path: str | Path) -> list[str]:
    """Texts from a ``.txt`` file (one per line) or a BEIR-style ``.jsonl`` (``title`` + ``text``)."""
    file = Path(path)
    if not file.is_file():
        raise InvalidInputError(f"calibration file {str(file)!r} does not exist", param="calibration")
    lines = [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    if file.suffix == ".jsonl":
        records = [json.loads(line) for line in lines]
        lines = [f"{r.get('title', '')} {r['text']}".strip() for r in records]
    if len(lines) < 2:
        raise InvalidInputError(f"calibration file {str(file)!r} needs at least 2 texts", param="calibration")
    return lines
