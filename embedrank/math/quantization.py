"""Compact embeddings: scalar (int8/uint8) and binary quantization, with sentence-transformers'
``quantize_embeddings`` semantics, so vectors from embedrank and from sentence-transformers are
interchangeable.

- ``int8`` / ``uint8``: each dimension's calibration range ``[min, max]`` is cut into 256 buckets;
  a value's bucket is ``floor((x - min) / step)`` clipped to ``[0, 255]`` (minus 128 for ``int8``).
  The ranges come from calibration embeddings (:func:`quantization_ranges`), never from the vectors
  being quantized, so a vector's code does not depend on what else was in its batch.
- ``binary`` / ``ubinary``: one bit per dimension (``x > 0``), packed 8 to a byte, most significant bit
  first (``np.packbits``); ``binary`` stores each byte minus 128 as int8.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

# An embedding type is the format of an output vector (Cohere's ``embedding_types``); it is not the
# precision a runtime computes in (:mod:`embedrank.runtime.backends`).
EmbeddingType = Literal["float32", "int8", "uint8", "binary", "ubinary"]
EMBEDDING_TYPES: tuple[str, ...] = ("float32", "int8", "uint8", "binary", "ubinary")
_ALIASES = {"float": "float32"}  # Cohere's name for float32


def check_embedding_type(embedding_type: str) -> EmbeddingType:
    """``embedding_type`` with Cohere's ``float`` read as ``float32``; ValueError for anything else.

    >>> check_embedding_type("float"), check_embedding_type("ubinary")
    ('float32', 'ubinary')
    """
    name = _ALIASES.get(embedding_type, embedding_type)
    if name not in EMBEDDING_TYPES:
        raise ValueError(f"embedding type must be one of {['float', *EMBEDDING_TYPES]}, got {embedding_type!r}")
    return name  # type: ignore[return-value]


def quantization_ranges(calibration: np.ndarray) -> np.ndarray:
    """Per-dimension ``[min, max]`` of calibration embeddings ``(N, D)``, N >= 2: ``(2, D)`` float32.

    >>> quantization_ranges(np.array([[0.0, -1.0], [0.5, 1.0], [0.25, 0.0]])).tolist()
    [[0.0, -1.0], [0.5, 1.0]]
    """
    x = np.asarray(calibration, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"calibration embeddings must be (N >= 2, D), got shape {x.shape}")
    return np.vstack([x.min(axis=0), x.max(axis=0)]).astype(np.float32)


def _steps(ranges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ranges = np.asarray(ranges, dtype=np.float32)
    if ranges.ndim != 2 or ranges.shape[0] != 2:
        raise ValueError(f"ranges must be (2, D) [min; max], got shape {ranges.shape}")
    starts = ranges[0]
    steps = (ranges[1] - starts) / 255
    return starts, np.where(steps == 0, 1, steps).astype(np.float32)


def quantize(embeddings: np.ndarray, embedding_type: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """Quantize float embeddings ``(N, D)``.

    Returns ``(N, D)`` float32 / int8 / uint8, or ``(N, ceil(D / 8))`` int8 (``binary``) / uint8
    (``ubinary``). ``ranges`` ``(2, D)`` is required for ``int8`` and ``uint8``.

    >>> x = np.array([[0.5, -0.25, 0.0, 1.0, -1.0, 0.1, 0.2, -0.3, 0.4]], dtype=np.float32)
    >>> quantize(x, "ubinary").tolist(), quantize(x, "binary").tolist()
    ([[150, 128]], [[22, 0]])
    >>> quantize(x[:, :2], "int8", np.array([[-1.0, -1.0], [1.0, 1.0]])).tolist()
    [[63, -33]]
    """
    name = check_embedding_type(embedding_type)
    x = np.asarray(embeddings, dtype=np.float32)
    if name == "float32":
        return x
    if name in ("binary", "ubinary"):
        bits = np.packbits(x > 0, axis=-1)
        return (bits.astype(np.int16) - 128).astype(np.int8) if name == "binary" else bits
    if ranges is None:
        raise ValueError(f"{name} quantization needs calibration ranges (2, D)")
    starts, steps = _steps(ranges)
    if starts.shape[0] != x.shape[-1]:
        raise ValueError(f"ranges cover {starts.shape[0]} dimensions, the embeddings have {x.shape[-1]}")
    buckets = np.clip(np.floor((x - starts) / steps), 0, 255)
    return (buckets - 128).astype(np.int8) if name == "int8" else buckets.astype(np.uint8)


def dequantize(codes: np.ndarray, embedding_type: str, ranges: np.ndarray) -> np.ndarray:
    """Float32 ``(N, D)`` lower edges of the buckets of ``int8``/``uint8`` codes (the inverse
    sentence-transformers uses to rescore scalar-quantized candidates).

    >>> r = np.array([[-1.0], [1.0]])
    >>> dequantize(quantize(np.array([[0.5]]), "int8", r), "int8", r).astype(float).round(3).tolist()
    [[0.498]]
    """
    name = check_embedding_type(embedding_type)
    if name not in ("int8", "uint8"):
        raise ValueError(f"only int8 and uint8 codes can be dequantized, got {embedding_type!r}")
    starts, steps = _steps(ranges)
    values = np.asarray(codes).astype(np.float32) + (128 if name == "int8" else 0)
    return (values * steps + starts).astype(np.float32)


def unpack_signs(codes: np.ndarray, dimension: int) -> np.ndarray:
    """``ubinary`` codes ``(N, ceil(D / 8))`` -> ``(N, D)`` float32 of +1 (bit set) / -1: the vectors a float
    query is rescored against. Their dot product with a query ranks the candidates as
    sentence-transformers' 0/1 rescoring does (it differs by a per-query scale and offset).

    >>> unpack_signs(np.array([[0b10100000]], dtype=np.uint8), 3).tolist()
    [[1.0, -1.0, 1.0]]
    """
    bits = np.unpackbits(np.asarray(codes, dtype=np.uint8), axis=-1)[..., :dimension]
    return bits.astype(np.float32) * 2 - 1
