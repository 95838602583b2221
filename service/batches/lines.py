"""A batch's input file, read and checked line by line, and one line run as the direct request would be.

An input line is OpenAI's: ``{"custom_id": "...", "method": "POST", "url": "/v1/embeddings", "body": {...}}``.
:func:`read_input` checks the file's shape before anything runs (each line a JSON object with a unique
non-empty ``custom_id``, method ``POST``, the batch's endpoint as ``url`` and an object as ``body``); a file
that breaks these fails the batch, with one error per line at fault (OpenAI's batch ``errors``). The body is
not checked there: :func:`run_line` decodes it against the endpoint's schema and calls the same core call as
the endpoint's route, so a bad body gets, in the error file, the status and error body the direct request
would have got, and the other lines run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import re
import secrets
from collections.abc import Iterator
from typing import Any, BinaryIO

import msgspec

from embedrank.errors import ModelUnavailableError, NotReadyError, OverloadedError, shorten
from service import request_ids
from service.batches.store import Chunk
from service.context import BACKGROUND_PRIORITY, Context
from service.decoding import decode_strict
from service.endpoints import BATCH
from service.errors import body_too_large, error_body, is_unexpected, to_api_error

logger = logging.getLogger("embedrank.service")

MAX_REPORTED_ERRORS = 100  # errors listed for a malformed input file (OpenAI lists them per line)
QUOTED = 200  # characters of a line's own value an error quotes at most: a batch object stays small


class InputLine(msgspec.Struct):
    custom_id: str
    method: str
    url: str
    body: msgspec.Raw  # kept as sent: decoded once, against the endpoint's schema, when the line runs


@dataclasses.dataclass(frozen=True)
class Checked:
    """An input file that can run: its request lines cut into chunks; or the errors that fail it."""

    chunks: list[Chunk]
    errors: list[dict[str, Any]]


def read_input(batch_id: str, content: bytes | BinaryIO, endpoint: str, *, chunk_lines: int, max_lines: int) -> Checked:
    """Check every line of ``content`` (the file's bytes, or the file opened in binary mode; lines end at
    ``\\n``, as JSON Lines say; blank lines are skipped) and cut the request lines into chunks of
    ``chunk_lines``, each with its bytes in the file. Errors name their line (1-based), as OpenAI's do.

    The file is read a block at a time (:func:`written_lines`): what it holds is a block, the longest line, a
    16-byte digest of each ``custom_id`` and two offsets per request line (at most ``max_lines``), whatever
    the file's size or its blank lines.

    >>> ok = b'{"custom_id": "%d", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}\\n'
    >>> read_input("b", b"".join(ok % i for i in range(3)), "/v1/embeddings", chunk_lines=2, max_lines=10).chunks[1].first_line
    2
    >>> read_input("b", ok % 1 + ok % 1, "/v1/embeddings", chunk_lines=2, max_lines=10).errors[0]["code"]
    'duplicate_custom_id'
    """
    errors: list[dict[str, Any]] = []
    seen: set[bytes] = set()  # each custom_id's digest
    starts: list[tuple[int, int]] = []  # (start byte, end byte) of each request line
    for number, start, raw in written_lines(io.BytesIO(content) if isinstance(content, bytes) else content):
        if len(starts) >= max_lines:
            errors.append(_error("too_many_lines", f"the file has more than {max_lines} request lines", number))
            break
        problem = _check(raw, endpoint, seen)
        if problem is not None:
            errors.append(_error(*problem, number))
            if len(errors) >= MAX_REPORTED_ERRORS:
                break
            continue
        starts.append((start, start + len(raw)))
    if not starts and not errors:
        errors.append(_error("empty_file", "the input file has no request line", None))
    if errors:
        return Checked([], errors)
    chunks = [
        Chunk(batch_id, n, first, len(part), part[0][0], part[-1][1])
        for n, first in enumerate(range(0, len(starts), chunk_lines))
        for part in [starts[first : first + chunk_lines]]
    ]
    return Checked(chunks, [])


_WRITTEN = re.compile(rb"[^ \t\r\n\f\v]")  # a byte that is not blank


def written_lines(file: BinaryIO, block: int = 1 << 20) -> Iterator[tuple[int, int, bytes]]:
    """Each line of ``file`` that is not blank, as ``(line number from 1, its first byte's offset, the line with
    its \\n)``, read ``block`` bytes at a time: blank lines are skipped in C, so a file of millions of them takes
    a fraction of a second and no memory beyond one block and the longest line."""
    buffer, at, offset, number = b"", 0, 0, 1  # offset: the file offset of buffer[0]; number: the line at ``at``
    ended = False
    while True:
        found = _WRITTEN.search(buffer, at)
        if found is None:
            if ended:
                return
            number += buffer.count(b"\n", at)
            offset += len(buffer)
            buffer, at = file.read(block), 0
            ended = len(buffer) < block
            continue
        number += buffer.count(b"\n", at, found.start())
        newline = buffer.rfind(b"\n", at, found.start())
        begin = newline + 1 if newline >= 0 else at
        end = buffer.find(b"\n", found.start())
        while end < 0 and not ended:  # the line goes on past the buffer
            more = file.read(block)
            ended = len(more) < block
            buffer, offset, begin = buffer[begin:] + more, offset + begin, 0
            end = buffer.find(b"\n")
        stop = end + 1 if end >= 0 else len(buffer)
        yield number, offset + begin, buffer[begin:stop]
        number += 1
        at = stop


def _check(raw: bytes, endpoint: str, seen: set[bytes]) -> tuple[str, str] | None:
    try:
        line = msgspec.json.decode(raw, type=InputLine)
    except msgspec.ValidationError as exc:
        return (
            "invalid_request_line",
            f"the line is not a request line ({exc}); each line needs custom_id, method, url and body",
        )
    except msgspec.DecodeError:
        return "invalid_json_line", "the line is not valid JSON"
    except UnicodeDecodeError as exc:  # a string of the line (custom_id, method, url) is not UTF-8
        return "invalid_json_line", f"the line is not valid JSON: it is not UTF-8 (byte {exc.start} of a string)"
    except RecursionError:
        return "invalid_json_line", "the line is not valid JSON: it nests too deeply"
    if not line.custom_id:
        return "missing_custom_id", "custom_id is empty"
    digest = hashlib.blake2b(line.custom_id.encode(), digest_size=16).digest()
    if digest in seen:
        return (
            "duplicate_custom_id",
            f"custom_id {shorten(line.custom_id, QUOTED)!r} is used by an earlier line; each must be unique",
        )
    seen.add(digest)
    if line.method != "POST":
        return "invalid_method", f"method must be POST, got {shorten(line.method, QUOTED)!r}"
    if line.url != endpoint:
        return "mismatched_url", f"url {shorten(line.url, QUOTED)!r} is not the batch's endpoint {endpoint!r}"
    if not bytes(line.body).startswith(b"{"):  # the line is valid JSON: its body is an object or it is not
        return "invalid_request_line", "the line's body is not a JSON object"
    return None


def _error(code: str, message: str, line: int | None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": None, "line": line}


def request_lines(part: bytes) -> list[InputLine]:
    """The request lines in ``part`` of a file :func:`read_input` accepted (a chunk's bytes)."""
    return [msgspec.json.decode(raw, type=InputLine) for raw in part.split(b"\n") if raw.strip()]  # as read_input


class Retry(Exception):
    """The line could not run for now (the engine is overloaded): run it again shortly."""


class Unready(Exception):
    """The line could not run because the service is not ready (loading, draining, stopped): its chunk is given
    back for a ready worker (or the batch's expiry) rather than held while waiting."""


async def run_line(line: InputLine, ctx: Context) -> tuple[int, bytes, str]:
    """``line``'s response as ``(status code, JSON body, request id)``: its body decoded against its endpoint's
    schema (:data:`service.endpoints.BATCH`) and the endpoint's call made with ``ctx`` (batch lines': vectors
    of texts embedded before come from the cache), behind every direct request (:data:`BACKGROUND_PRIORITY`); a failure
    gets the status and error body the direct request would get, with the line's own request id: a body over
    ``max_body_bytes`` is refused as the direct request is (413), and the texts' and tokens' limits are the
    endpoint call's own.

    A model that could not be loaded at start (``on_model_failure = "serve-others"``) gets its 503 error line, as
    the direct request does: waiting would not bring it.

    Raises:
        Retry: the engine refused the work for now (overloaded: 429, or another 429 or 503).
        Unready: the service or the engine is not ready (loading, draining).
    """
    endpoint = BATCH[line.url]
    request_id = request_ids.new_id()
    if len(line.body) > ctx.limits.max_body_bytes:  # what the direct request's body limit refuses
        return 413, msgspec.json.encode(error_body(body_too_large(), request_id)), request_id
    try:
        data = decode_strict(bytes(line.body), endpoint.body)
        if hasattr(data, "priority"):
            data = msgspec.structs.replace(data, priority=max(data.priority, BACKGROUND_PRIORITY))
        body, _ = await endpoint.call(data, ctx)
        return 200, msgspec.json.encode(body), request_id
    except OverloadedError as exc:
        raise Retry(str(exc)) from exc
    except NotReadyError as exc:
        if not isinstance(exc, ModelUnavailableError):
            raise Unready(str(exc)) from exc
        return 503, msgspec.json.encode(error_body(to_api_error(exc), request_id)), request_id
    except Exception as exc:
        error = to_api_error(exc)
        if error.status in (429, 503):
            raise Retry(error.message) from exc
        if is_unexpected(error):
            logger.error(
                "request %s: internal error on batch line %r (%s)", request_id, line.custom_id, line.url, exc_info=exc
            )
        return error.status, msgspec.json.encode(error_body(error, request_id)), request_id


def result_line(custom_id: str, status: int, body: bytes, request_id: str) -> bytes:
    """One line of an output or error file, as OpenAI writes it."""
    return (
        msgspec.json.encode(
            {
                "id": f"batch_req_{secrets.token_hex(12)}",
                "custom_id": custom_id,
                "response": {
                    "status_code": status,
                    "request_id": request_id,
                    "body": msgspec.Raw(body),
                },
                "error": None,
            }
        )
        + b"\n"
    )


def unrun_line(custom_id: str, code: str, message: str) -> bytes:
    """The error-file line of a request that never ran (the batch expired first)."""
    return (
        msgspec.json.encode(
            {
                "id": f"batch_req_{secrets.token_hex(12)}",
                "custom_id": custom_id,
                "response": None,
                "error": {"code": code, "message": message},
            }
        )
        + b"\n"
    )
