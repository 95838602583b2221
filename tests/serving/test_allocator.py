"""embedrank.serving.allocator: freed activation-sized blocks are reused instead of page-faulted in again."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

PROBE = """
import resource, sys
import numpy as np
from embedrank.serving.allocator import tune_malloc
tuned = tune_malloc() if sys.argv[1] == "tune" else None
def one_layer():  # a 40 MB activation, written (as a forward pass does), then freed
    a = np.empty(10 * 1024 * 1024, dtype=np.float32)
    a.fill(1.0)
    del a
one_layer()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    one_layer()
print(tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout.split()
    return out[0], int(out[1])


@pytest.mark.slow  # a subprocess that allocates 400 MB
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning is Linux-only")
def test_tuned_malloc_reuses_freed_activation_memory() -> None:
    _, default_faults = _faults("default")
    tuned, tuned_faults = _faults("tune")
    assert tuned == "True"
    # glibc's default hands the 40 MB block back with munmap, so every layer faults it in again: 10 x ~10k
    # faults with 4 KiB pages, down to 10 x ~20 when numpy's madvise gets transparent huge pages (a clean CI
    # clone measured 210), so the floor is 10 faults per layer. Tuned, the block is reused: 0 faults here.
    assert default_faults >= 100
    assert tuned_faults * 10 < default_faults


def test_service_setting_switches_tuning_off() -> None:
    from service.settings import Settings

    assert Settings.from_env({}).engine.tune_malloc is True
    assert Settings.from_env({"EMBEDRANK_TUNE_MALLOC": "0"}).engine.tune_malloc is False


TRIM_PROBE = """
import numpy as np
from embedrank.serving.allocator import trim_heap, tune_malloc
def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
tune_malloc()
base = rss_mb()
blocks = [np.ones(1024 * 1024, dtype=np.float32) for _ in range(100)]  # 400 MB of 4 MB heap blocks
del blocks
kept = rss_mb()
released = trim_heap()
print(round(base), round(kept), round(rss_mb()), released)
"""


@pytest.mark.slow  # a subprocess that allocates 400 MB
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim is Linux-only")
def test_trim_gives_the_kept_peak_back() -> None:
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True, check=True).stdout.split()
    base, kept, after, released = int(out[0]), int(out[1]), int(out[2]), out[3]
    assert kept - base > 300  # tuned malloc keeps the freed 400 MB (the price of no page faults)
    assert released == "True" and after - base < 100  # after the trim the process is back near its base


def test_engine_calls_on_idle_once_per_quiet_period() -> None:
    import asyncio
    import threading

    from embedrank.serving.engine import BatchEngine, EngineConfig
    from embedrank.types import ModelOutput

    class Echo:
        max_seq_length = 8

        def item_tokens(self, item):
            return len(item)

        def run_batch(self, items):
            return ModelOutput(np.array(list(items)), [1] * len(items), [False] * len(items))

    idle = threading.Event()
    calls = []

    def on_idle():
        calls.append(1)
        idle.set()

    async def main():
        engine = BatchEngine(Echo(), EngineConfig(max_wait_ms=0, idle_seconds=0.01), on_idle=on_idle)
        engine.start()
        assert not idle.is_set()  # no work yet: nothing to give back
        await engine.submit(["a"])
        assert await asyncio.to_thread(idle.wait, 10)
        idle.clear()
        await engine.submit(["b"])  # a new busy period, then quiet again: one more call
        assert await asyncio.to_thread(idle.wait, 10)
        await engine.drain(1)

    asyncio.run(main())
    assert len(calls) == 2
