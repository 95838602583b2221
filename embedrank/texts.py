"""Sources of sample texts: a file of texts, seeded pseudo-sentences drawn from a model's own vocabulary
(needs no data, the same on every machine), and a seeded sample of SciFact from the data directory. The
int8 runtime's calibration and the int8/uint8 ranges of an encoder's vectors use texts from here when the
user names none.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from embedrank.errors import InvalidInputError
from embedrank.paths import default_data_dir

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


def seeded_sample(texts: list[str], n: int, seed: int = 0) -> list[str]:
    """``n`` of ``texts`` drawn without replacement (seeded), in their original order; all when fewer.

    >>> seeded_sample(["a", "b", "c", "d"], 2), seeded_sample(["a"], 2)
    (['c', 'd'], ['a'])
    """
    if len(texts) <= n:
        return texts
    picks = np.random.default_rng(seed).choice(len(texts), size=n, replace=False)
    return [texts[i] for i in sorted(picks)]


def data_dir_sample(n: int = 300) -> list[str] | None:
    """``n`` seeded texts from SciFact in the data directory (two thirds passages, one third queries), the
    default int8 calibration of :meth:`Encoder.from_pretrained <embedrank.models.encoder.Encoder.from_pretrained>`;
    None when the data directory holds no SciFact."""
    data = default_data_dir()
    scifact = data / "scifact" if data else None
    if scifact is None or not (scifact / "corpus.jsonl").is_file():
        return None
    passages = seeded_sample(read_texts(scifact / "corpus.jsonl"), n * 2 // 3)
    return passages + seeded_sample(read_texts(scifact / "queries.jsonl"), n - len(passages))
