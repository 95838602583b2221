"""Keep glibc malloc from returning activation memory to the OS after every forward pass.

A transformer forward pass allocates and frees the same large tensors once per layer (the FFN
intermediate alone is batch x seq x 1536 floats: 40 MB for 32 x 205 tokens with MiniLM). glibc serves
blocks above its mmap threshold (at most 32 MB, dynamically adjusted) with ``mmap`` and gives them back
with ``munmap`` on free, and each thread other than the main one gets its own arena whose heaps are
trimmed eagerly. Either way the next layer page-faults the memory in again: on the 2-core benchmark
machine a batch of 32 passages took about a million minor faults and 3 s of system time per 256
passages (``eval/benchmarks/service.py``'s server runs its forward passes in a worker thread, the worst case).

:func:`tune_malloc` applies the usual fix (what jemalloc/tcmalloc ``LD_PRELOAD`` recipes achieve) from
inside the process: one arena, a high mmap threshold and no trimming, so freed activation memory is
reused. The cost is that the process keeps its peak heap (one batch's activations) instead of
returning it. It is a no-op off glibc. The service calls it at startup (``EMBEDRANK_TUNE_MALLOC=0``
turns that off); notebooks and scripts may call it too.
"""

from __future__ import annotations

import ctypes
import logging
import sys

logger = logging.getLogger(__name__)

# mallopt parameters from <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

MMAP_THRESHOLD = 1 << 30  # blocks below 1 GiB come from the heap and are reused
TRIM_THRESHOLD = (1 << 31) - 1  # never give the top of the heap back


def tune_malloc(*, arena_max: int = 1) -> bool:
    """Set glibc's ``M_ARENA_MAX``, ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` for tensor workloads.

    Call it before worker threads start (threads that already own an arena keep it). Returns True when
    all three settings were applied, False off Linux/glibc or when ``mallopt`` refused one.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)  # the C library this process already runs on (no ldconfig subprocess)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - present only in glibc (musl has no arenas to tune)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = all(
        mallopt(param, value) == 1
        for param, value in (
            (M_ARENA_MAX, arena_max),
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        )
    )
    if not ok:
        logger.warning("mallopt refused a setting; the allocator keeps its defaults")
    return ok


def trim_heap() -> bool:
    """Give the heap's free memory back to the OS (glibc ``malloc_trim(0)``).

    With :func:`tune_malloc` the process keeps its peak heap between batches, which is what makes busy
    periods fast; after a quiet period the engine calls this (``on_idle``) so an idle server shrinks back.
    Returns True when memory was released, False when there was none or off glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        malloc_trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    return bool(malloc_trim(0))
