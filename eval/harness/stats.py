"""Timing and memory statistics the benchmarks share: latency percentiles, a process's resident memory and
CPU time."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` as one of the measured values (nearest rank); NaN when empty.

    >>> percentile([0.5, 0.1, 0.3, 0.2, 0.4], 50), percentile([], 99)
    (0.3, nan)
    """
    return float(np.percentile(values, q, method="nearest")) if values else float("nan")


def rss_mib(pid: int | str = "self", field: str = "VmRSS") -> float:
    """MiB of process ``pid`` (this one by default) resident now (``VmRSS``) or at its peak (``VmHWM``), as
    ``/proc/<pid>/status`` says; NaN where the field is missing."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def tree_rss_mib(pid: int) -> float:
    """MiB resident of process ``pid`` and every process below it (a server's file readers, its workers)."""
    import psutil

    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20


def cpu_seconds(pid: int | None) -> tuple[float, float]:
    """CPU seconds (user + system) used so far by process ``pid`` and by its main thread (zeros without a pid)."""
    if pid is None:
        return 0.0, 0.0
    import psutil

    process = psutil.Process(pid)
    total = process.cpu_times()
    main = next((t for t in process.threads() if t.id == pid), None)
    return total.user + total.system, (main.user_time + main.system_time) if main else 0.0


def process_role(process: Any, root: int) -> str:
    """What a process of a server's tree is, for a benchmark's table: ``server`` (the process started; a replica's
    supervisor), a replica's ``engine`` and ``fronts``, the file readers' fork server, multiprocessing's resource
    tracker, else its own name."""
    if process.pid == root:
        return "server"
    command = " ".join(process.cmdline())
    if "service.replica.engine" in command:
        return "engine"
    if "service.replica.front" in command:
        return "fronts"
    if "forkserver" in command:
        return "file readers"
    if "resource_tracker" in command:
        return "resource tracker"
    return str(process.name())


def tree_cpu_seconds(pid: int | None) -> dict[str, float]:
    """CPU seconds (user + system) used so far by process ``pid`` and every process below it, summed by
    :func:`process_role` (empty without a pid; a process that ended while it was read is left out)."""
    return _by_role(pid, lambda process: process.cpu_times().user + process.cpu_times().system)


def tree_rss_bytes(pid: int | None) -> dict[str, float]:
    """Resident bytes of process ``pid`` and every process below it now, summed by :func:`process_role` (empty
    without a pid)."""
    return _by_role(pid, lambda process: process.memory_info().rss)


def _by_role(pid: int | None, measure: Callable[[Any], float]) -> dict[str, float]:
    """``measure(process)`` of ``pid`` and every process below it, summed by :func:`process_role`; a process that
    ended while it was read is left out."""
    if pid is None:
        return {}
    import psutil

    root = psutil.Process(pid)
    totals: dict[str, float] = {}
    for process in [root, *root.children(recursive=True)]:
        try:
            value, role = measure(process), process_role(process, pid)
        except psutil.NoSuchProcess:
            continue
        totals[role] = totals.get(role, 0.0) + value
    return totals
