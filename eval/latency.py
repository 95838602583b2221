"""Latency statistics shared by the benchmarks in this directory."""

from __future__ import annotations

import numpy as np


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` as one of the measured values (nearest rank); NaN when empty.

    >>> percentile([0.5, 0.1, 0.3, 0.2, 0.4], 50), percentile([], 99)
    (0.3, nan)
    """
    return float(np.percentile(values, q, method="nearest")) if values else float("nan")
