"""Sources of sample texts: a file of texts, the sample of real texts shipped with the package, and seeded
pseudo-sentences drawn from a model's own vocabulary. The int8 runtime's calibration, ``auto``'s
measurement and the int8/uint8 ranges of an encoder's vectors use the packaged sample when the user names
no texts of their own; nothing here reads the data directory.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from embedrank.errors import InvalidInputError

DEFAULT_TEXTS = 1000
SAMPLE_FILE = Path(__file__).parent / "sample" / "texts.jsonl"
"""800 real English texts of several kinds and lengths (``embedrank/sample/NOTICE.md`` says where each comes
from, under which licence, and how ``eval/build_sample.py`` made the file)."""
SAMPLE_NAME = "embedrank's packaged sample"
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


@functools.cache
def _packaged_rows() -> tuple[dict[str, str], ...]:
    return tuple(json.loads(line) for line in SAMPLE_FILE.read_text(encoding="utf-8").splitlines() if line)


def packaged_sample(kind: str | None = None) -> list[str]:
    """The texts of the sample shipped with the package (:data:`SAMPLE_FILE`), in its (shuffled) order, so
    any prefix mixes its kinds: Python documentation and scikit-learn dataset descriptions chunked into
    passages of 28 to 221 words, Python FAQ questions, WordNet definitions and example sentences. ``kind``
    (``passage``, ``question``, ``definition``, ``example``) keeps one kind.

    >>> len(packaged_sample()), len(packaged_sample("question"))
    (800, 150)
    """
    return [r["text"] for r in _packaged_rows() if kind is None or r["kind"] == kind]
