"""Files written whole or not at all (embedrank.paths): a directory built once by processes that build it at
once, and what a process told to stop removes."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from embedrank.paths import build_directory, remove_unfinished, writing

pytestmark = pytest.mark.kernel_free


def test_builders_at_once_take_turns_and_the_directory_is_built_once(tmp_path):
    """Four builders of one directory at once (each with its own lock file handle, as processes would): one
    builds, the others wait for it and keep its result; no temporary folder is left."""
    target, calls, start = tmp_path / "export", [], threading.Barrier(4)

    def build(folder: Path) -> None:
        calls.append(folder)
        time.sleep(0.2)  # long enough for the others to arrive while it builds
        (folder / "config.json").write_text("{}")

    def builder(_: int) -> str:
        start.wait()
        return build_directory(target, build)

    with ThreadPoolExecutor(4) as threads:
        results = list(threads.map(builder, range(4)))
    assert results == [str(target)] * 4 and len(calls) == 1
    assert (target / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # the lock lives in the temporary directory


def test_what_is_still_being_written_is_removed_on_a_stop(tmp_path):
    folder, done = tmp_path / ".partial", tmp_path / "done"
    folder.mkdir()
    done.mkdir()
    with writing(folder):
        assert remove_unfinished() == [folder]
    assert not folder.exists() and done.exists() and remove_unfinished() == []
