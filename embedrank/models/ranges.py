"""Ranges for int8/uint8 embeddings: the sample of texts whose embeddings set each dimension's range.

sentence-transformers computes int8 ranges from "calibration embeddings" and warns against taking them
from the vectors being quantized (a vector's code would then depend on its batch). In embedrank that
sample is the *range sample* (the word "calibration" is kept for the int8 runtime, whose activations NNCF
calibrates). A model gets its range sample from, in order:

1. :meth:`RangeSample.of`: texts, or a file the user (or the service's model entry, ``ranges``) names:
   one text per line (``.txt``), or a BEIR-style ``.jsonl`` whose records have ``text`` (and optionally
   ``title``). A sample of the user's own corpus is the best choice.
2. The documented default, :func:`embedrank.texts.vocabulary_texts`: 1,000 pseudo-sentences of 8 to 64 words drawn with a
   fixed seed from the model's own vocabulary (whole alphabetic words of three letters or more). They
   need no data files and give every model the same recipe; on SciFact they lose little against a
   corpus sample (see the README's compact-vector table).

The embeddings are computed once per model and kept; ranges for a truncated ``dimensions`` are taken from
the truncated (and, for normalizing models, renormalized) sample embeddings, as the vectors they
quantize are.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from embedrank.errors import InvalidInputError
from embedrank.math.quantization import quantization_ranges
from embedrank.math.similarity import truncate_dims
from embedrank.texts import read_texts


class RangeSample:
    """A model's range sample: texts and, once computed, their embeddings ``(N, D)`` (thread-safe)."""

    def __init__(self, texts: Sequence[str]) -> None:
        if len(texts) < 2:
            raise InvalidInputError("a range sample needs at least 2 texts", param="ranges")
        self.texts = list(texts)
        self._embeddings: np.ndarray | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, texts: Sequence[str] | str | Path) -> RangeSample:
        """From a list of texts, or the path of a ``.txt``/``.jsonl`` file (:func:`read_texts`)."""
        return cls(read_texts(texts) if isinstance(texts, (str, Path)) else texts)

    def embeddings(self, encode: Callable[[list[str]], np.ndarray]) -> np.ndarray:
        """The sample's embeddings, computed with ``encode`` on first use."""
        with self._lock:
            if self._embeddings is None:
                self._embeddings = np.asarray(encode(self.texts), dtype=np.float32)
            return self._embeddings

    def ranges(
        self, encode: Callable[[list[str]], np.ndarray], *, dimensions: int | None = None, normalize: bool = True
    ) -> np.ndarray:
        """``(2, dimensions or D)`` per-dimension ``[min; max]`` for :func:`~embedrank.math.quantization.quantize`."""
        sample = truncate_dims(self.embeddings(encode), dimensions, renormalize=normalize)
        return quantization_ranges(sample)
