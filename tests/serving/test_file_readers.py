"""Untrusted files read in bounded, killable processes (:mod:`embedrank.serving.file_readers`): the same
documents as reading in process, and each bound (wall clock, CPU, memory, characters while reading) ending a
read that passes it with the bound's name, the process gone."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from pathlib import Path

import pytest

from embedrank.retrieval.documents import InvalidFileError, UnsupportedFileError, joined, read_documents
from embedrank.serving.file_readers import FileReaders, ReadLimits, spooled_pieces
from embedrank.testing.hostile_files import pdf_sharing_one_stream, process_ended

pytestmark = [pytest.mark.slow, pytest.mark.kernel_free]  # processes of their own; no model

BOMB = pdf_sharing_one_stream(pages=2000, stream_bytes=300_000)  # minutes of extraction on any CPU


def read(path: Path, filename: str, **limits) -> list:
    """The documents the reading process spools, whole."""
    readers = FileReaders(slots=2, limits=ReadLimits(**limits))
    spool = path.with_name(path.name + ".spool")
    try:
        count = asyncio.run(readers.read(path, filename, spool))
        docs = joined(spooled_pieces(spool))
        assert len(docs) == count
        return docs
    finally:
        readers.close()


def test_the_documents_are_those_read_in_process(tmp_path):
    files = {
        "a.txt": b"plain text\nover two lines",
        "b.html": b"<html><script>x()</script><p>Hello <b>world</b></p></html>",
        "c.jsonl": (json.dumps({"_id": "7", "title": "T", "text": "body", "year": 2024}) + "\n").encode(),
        "d.pdf": pdf_sharing_one_stream(pages=2, stream_bytes=200),
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
        assert read(tmp_path / name, name) == read_documents(name, content), name


def test_refusals_keep_their_kind_and_message(tmp_path):
    (tmp_path / "x").write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(InvalidFileError, match="is not UTF-8 text"):
        read(tmp_path / "x", "x.txt")
    with pytest.raises(UnsupportedFileError, match="are not read"):
        read(tmp_path / "x", "x.exe")
    with pytest.raises(InvalidFileError, match="was deleted before it was read"):
        read(tmp_path / "missing", "gone.txt")
    (tmp_path / "deep.json").write_bytes(b"[" * 200_000 + b"]" * 200_000)
    with pytest.raises(InvalidFileError, match="nests too deeply"):
        read(tmp_path / "deep.json", "deep.json")


def test_the_characters_are_counted_page_by_page(tmp_path):
    (tmp_path / "bomb.pdf").write_bytes(BOMB)
    with pytest.raises(InvalidFileError, match=r"more than 1000000 characters of text by its page 5 of 2000"):
        read(tmp_path / "bomb.pdf", "bomb.pdf", max_chars=1_000_000)


def test_the_wall_clock_kills_the_read(tmp_path):
    (tmp_path / "bomb.pdf").write_bytes(BOMB)
    with pytest.raises(InvalidFileError, match=r"took more than 1 s to read \(limit file_read_seconds\)"):
        read(tmp_path / "bomb.pdf", "bomb.pdf", seconds=1)
    assert not multiprocessing.active_children()


def test_the_cpu_limit_ends_the_read(tmp_path):
    (tmp_path / "bomb.pdf").write_bytes(BOMB)
    with pytest.raises(InvalidFileError, match=r"more than 1 s of CPU to read \(limit file_read_cpu_seconds\)"):
        read(tmp_path / "bomb.pdf", "bomb.pdf", cpu_seconds=1, seconds=600)


def test_the_memory_limit_refuses_what_needs_more(tmp_path):
    (tmp_path / "big.json").write_bytes(b'"' + b"word " * 10_000_000 + b'"')  # 50 MB parsed whole
    with pytest.raises(InvalidFileError, match=r"needs more than 20 MB of memory to read \(limit file_read_memory\)"):
        read(tmp_path / "big.json", "big.json", memory_bytes=20 << 20)
    assert read(tmp_path / "big.json", "big.json", memory_bytes=512 << 20)[0].text.startswith('"word word')


def test_plain_text_is_read_in_pieces_within_a_few_megabytes(tmp_path):
    """A 50 MB text file of one line is read within 20 MB of memory (read and spooled a block at a time), and
    its text is whole."""
    (tmp_path / "big.txt").write_bytes(b"word " * 10_000_000)
    (doc,) = read(tmp_path / "big.txt", "big.txt", memory_bytes=20 << 20)
    assert len(doc.text) == 50_000_000 and doc.text.startswith("word word")


def test_a_cancelled_read_kills_its_process(tmp_path):
    (tmp_path / "bomb.pdf").write_bytes(BOMB)

    async def main():
        readers = FileReaders(slots=1, limits=ReadLimits(seconds=600))
        task = asyncio.create_task(readers.read(tmp_path / "bomb.pdf", "bomb.pdf", tmp_path / "spool"))
        while not multiprocessing.active_children():  # the process has started
            await asyncio.sleep(0.01)
        (process,) = multiprocessing.active_children()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        ended = await asyncio.to_thread(process_ended, process.pid, 60)
        readers.close()
        return ended

    assert asyncio.run(main())  # killed: not left to run to its limit of 600 s
