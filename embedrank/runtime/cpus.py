"""How many CPUs this process may really use: the CPUs it may run on, bounded by its container's CPU quota.

``torch.get_num_threads()`` counts the host's cores (or the affinity mask), not a container's quota (cgroup
v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``): a 4-CPU container on a 64-core host would
run 64 threads and thrash. :func:`limit_threads` lowers torch's thread count (which the OpenVINO and ONNX
Runtime backends and the serving engine follow) to :func:`usable_cpus`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
# the CPU features that decide which kernels run (vector width, int8 dot products, bf16, AMX)
FLAGS = (
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)


# environment settings that hold kernels to an older instruction set: torch's own, MKL's (torch's float matrix
# products), oneDNN's (torch's and OpenVINO's) and OpenVINO's own; ONNX Runtime has none (tests/as_avx2.sh)
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "OV_CPU_MAX_ISA")


def isa_limits() -> dict[str, str]:
    """The :data:`ISA_LIMITS` this process runs under, by name (empty when none is set): they change what is
    fastest, as the CPU does, so ``auto``'s cached decision and every benchmark record carry them."""
    return {k: os.environ[k] for k in ISA_LIMITS if os.environ.get(k)}


INT8_DOT_PRODUCTS = ("avx512_vnni", "avx_vnni", "amx_int8")  # u8 x s8 sums into int32 in one instruction


def has_int8_dot_products(flags: list[str] | None = None) -> bool:
    """Whether the CPU (``flags``, else :func:`cpu_identity`'s) multiplies int8 into int32 sums directly (VNNI,
    AMX). Without it, AVX2's int8 kernels add pairs of u8 x s8 products into int16, which saturates when
    both are large (255 x 127 x 2 > 32,767).

    >>> has_int8_dot_products(["avx2", "avx512_vnni"]), has_int8_dot_products(["avx2", "fma"])
    (True, False)
    """
    return bool(set(cpu_identity()[1] if flags is None else flags) & set(INT8_DOT_PRODUCTS))


def cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, list[str]]:
    """The CPU's model name and which of :data:`FLAGS` it has (``platform.processor()`` and no flags where
    ``cpuinfo`` cannot be read)."""
    import platform

    model, flags = "", set()
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), [f for f in FLAGS if f in flags]


def cgroup_cpu_quota(root: Path = CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (``1.5`` for 150 ms per 100 ms), or None without one.

    Reads cgroup v2 ``cpu.max`` (``"<quota> <period>"`` or ``"max <period>"``), else v1's
    ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` (quota ``-1``: none), under ``root`` or ``root/cpu``.
    """
    v2 = root / "cpu.max"
    try:
        if v2.is_file():
            quota, _, period = v2.read_text().strip().partition(" ")
            return None if quota == "max" else int(quota) / int(period or 100_000)
        for folder in (root, root / "cpu"):
            quota_file, period_file = folder / "cpu.cfs_quota_us", folder / "cpu.cfs_period_us"
            if quota_file.is_file() and period_file.is_file():
                quota_us = int(quota_file.read_text().strip())
                return None if quota_us < 0 else quota_us / int(period_file.read_text().strip())
    except (OSError, ValueError):
        return None  # unreadable or malformed: no quota known
    return None


def usable_cpus(root: Path = CGROUP) -> int:
    """The CPUs this process may use: its affinity mask, bounded by its cgroup quota (rounded up), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota(root)
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def limit_threads(root: Path = CGROUP) -> int:
    """Lower torch's intra-op thread count to :func:`usable_cpus` if it is higher; returns the count in use."""
    import torch

    cpus = usable_cpus(root)
    if torch.get_num_threads() > cpus:
        torch.set_num_threads(cpus)
    return int(torch.get_num_threads())
