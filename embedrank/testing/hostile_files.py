"""Files made to cost their reader far more than their size, for the tests and benchmarks of reading untrusted
uploads (:mod:`embedrank.serving.file_readers`) and images (:mod:`embedrank.models.images`).

>>> pdf = pdf_sharing_one_stream(pages=2000, stream_bytes=300_000)
>>> len(pdf) < 400_000
True
>>> import io, pypdf
>>> len(pypdf.PdfReader(io.BytesIO(pdf)).pages)
2000
"""

from __future__ import annotations

import struct
import time
import zlib


def pdf_sharing_one_stream(pages: int, stream_bytes: int) -> bytes:
    """A valid PDF of ``pages`` pages that all draw one Flate-compressed content stream, which inflates to about
    ``stream_bytes`` bytes of text-showing operators: small on disk, but each page's text is extracted anew
    (``pages`` x the stream's text in all)."""
    line = b"BT /F1 9 Tf 20 700 Td (the same words drawn again and again on every page of this file) Tj ET\n"
    stream = zlib.compress(line * max(1, stream_bytes // len(line)), 9)
    first_page = 5
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids ["
        + b" ".join(b"%d 0 R" % (first_page + i) for i in range(pages))
        + b"] /Count %d >>" % pages,
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 3 0 R /Resources << /Font << /F1 4 0 R >> >> >>"
    objects += [page] * pages
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def png_claiming(width: int, height: int, payload: int = 50_000) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` pixels, with ``payload`` bytes of compressed rows."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    stream, zeros, compressed = zlib.compressobj(9), b"\0" * (1 << 20), b""
    while len(compressed) < payload:  # rows of zeros: about 1,000 to 1 compressed, as a real bomb
        compressed += stream.compress(zeros)
    compressed += stream.flush()
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", compressed) + chunk(b"IEND", b"")


def process_ended(pid: int, seconds: float) -> bool:
    """Whether the process ``pid`` ended (gone, or a zombie left for its parent) within ``seconds``, read from
    ``/proc`` without reaping it: a process another thread waits on keeps its one exit report for that thread.

    >>> import os
    >>> process_ended(os.getpid(), seconds=0.0)
    False
    """
    deadline = time.monotonic() + seconds
    while True:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
