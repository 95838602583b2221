"""The CPUs a process may use: its affinity bounded by a container's quota, read from fake cgroup files."""

from __future__ import annotations

import os

import pytest
import torch

from embedrank.runtime.cpus import cgroup_cpu_quota, limit_threads, usable_cpus

AFFINITY = len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.cfs_quota_us": "400000\n", "cpu.cfs_period_us": "100000\n"}, 4.0),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0.5),
        ({"cpu.max": "garbage"}, None),
        ({}, None),
    ],
)
def test_the_cgroup_quota_is_read_from_v2_or_v1_files(tmp_path, files, quota):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == quota
    expected = AFFINITY if quota is None else max(1, min(AFFINITY, -(-quota // 1)))
    assert usable_cpus(tmp_path) == expected


def test_threads_follow_the_quota_not_the_host(tmp_path):
    (tmp_path / "cpu.max").write_text("100000 100000\n")  # one CPU
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(max(2, before))
        assert limit_threads(tmp_path) == 1 and torch.get_num_threads() == 1
        (tmp_path / "cpu.max").write_text("max 100000\n")
        assert limit_threads(tmp_path) == 1  # only ever lowered
    finally:
        torch.set_num_threads(before)
