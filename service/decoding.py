"""Strict decoding of request bodies against the published schema, before Litestar's own conversion.

Litestar converts ``data`` leniently (``"dimensions": "10"`` becomes 10, ``"truncate": 0`` becomes false).
Clients of a JSON API expect the schema to be the contract, so every POST body is first decoded here with
``msgspec`` in strict mode; a body that passes decodes to the same values in Litestar afterwards.

Every client mistake becomes a 400 in the error shape, never a 500:

- a body that is not UTF-8 (RFC 8259), or declares another charset: ``invalid_json``;
- nesting deeper than :data:`MAX_DEPTH`: ``invalid_json``, refused by a linear scan before the decoder
  recurses (the decoder's own recursion limit is the backstop);
- malformed JSON: ``invalid_json``; a missing field: ``missing_field``; a wrong type: ``invalid_type``
  (``"10"`` for an integer, ``0`` for a boolean; a number with a zero fraction such as ``10.0`` *is* an
  integer, as JSON Schema defines it, so it is accepted as 10);
  a value out of range (empty input, ``top_n < 1``): ``invalid_value`` or ``empty_*``. Each names the
  field in ``param`` and in the message.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
import zlib
from typing import Any, TypeVar

import msgspec

from embedrank.errors import shorten
from service.errors import APIError, invalid, validation_error

T = TypeVar("T")

MAX_DEPTH = 32  # a valid request nests 4 levels at most ({"documents": [{"text": ...}]})
_TOO_DEEP = re.compile(rb"(?:[\[{]\s*){%d}" % (MAX_DEPTH + 1))


def charset_of(content_type: str) -> str | None:
    """The ``charset`` parameter of a Content-Type header, lower-cased.

    >>> charset_of("application/json; charset=Latin-1"), charset_of("application/json")
    ('latin-1', None)
    """
    for part in content_type.split(";")[1:]:
        key, _, value = part.partition("=")
        if key.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


@dataclasses.dataclass(frozen=True)
class ByField:
    """A body whose schema depends on whether it has ``field``: TEI's ``/rerank`` sends ``texts``, Cohere's
    (vLLM's, Infinity's) sends ``documents`` to the same path."""

    field: str
    present: type
    absent: type

    def pick(self, value: Any) -> type:
        return self.present if isinstance(value, dict) and self.field in value else self.absent


def decompressed(raw: bytes, encoding: str, limit: int) -> bytes:
    """The body as sent (``Content-Encoding`` absent or ``identity``) or gunzipped (``gzip``, as clients send
    large batches), at most ``limit`` bytes once decompressed.

    Raises:
        APIError: 415 for any other encoding, 400 for a body that is not gzip, 413 past ``limit``.

    >>> import gzip; decompressed(gzip.compress(b'{"a": 1}'), "gzip", 100)
    b'{"a": 1}'
    """
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding not in ("gzip", "x-gzip"):
        raise APIError(
            415,
            f"Content-Encoding {shorten(encoding)!r} is not supported; send the body as is, or gzip",
            code="unsupported_media_type",
        )
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing
    try:
        out = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise invalid(f"the body is labelled gzip but is not gzip data: {exc}", code="invalid_json") from None
    if len(out) > limit:
        raise APIError(413, f"the decompressed body is over max_body_bytes={limit}", code="body_too_large")
    if not inflater.eof:
        raise invalid("the gzip body ends before its data does", code="invalid_json")
    return out


def decode_strict(raw: bytes, schema: Any, content_type: str = "application/json") -> Any:
    """Decode ``raw`` into ``schema`` (a type, or a :class:`ByField` choice of two) without coercing types;
    raise :class:`APIError` (400) on any mistake. A JSON ``null`` for a field means the field is absent (as
    OpenAI's and Cohere's servers read it): it takes its default, or is missing if it is required; except in
    a modification (a field whose default is ``UNSET`` and that takes ``None``), where null clears the value."""
    charset = charset_of(content_type)
    if charset not in (None, "utf-8", "utf8"):
        raise invalid(f"JSON bodies must be UTF-8 (RFC 8259); charset={charset} is not supported", code="invalid_json")
    if _TOO_DEEP.search(raw):
        raise invalid(f"request body nests deeper than {MAX_DEPTH} levels", code="invalid_json")
    try:
        decoded = msgspec.json.decode(raw)
        value = _normalized(decoded)
        if isinstance(schema, ByField):
            schema = schema.pick(value)
        if isinstance(decoded, dict) and (clearing := _clearing_fields(schema)):
            value.update({name: None for name in clearing if name in decoded and decoded[name] is None})
        return msgspec.convert(value, schema, strict=True)
    except UnicodeDecodeError as exc:
        raise invalid(f"request body is not valid UTF-8 (byte {exc.start})", code="invalid_json") from None
    except RecursionError:
        raise invalid("request body nests too deeply", code="invalid_json") from None
    except msgspec.ValidationError as exc:
        if str(exc).startswith("Number out of range"):  # raised while parsing, before any field is known
            raise invalid(
                f"{_number_field(raw)} holds a number out of range (JSON numbers here must fit a 64-bit float)",
                param=_number_field(raw, None),
                code="invalid_value",
            ) from None
        raise validation_error(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise invalid(f"request body is not valid JSON: {exc}", code="invalid_json") from None


_HUGE_NUMBER = re.compile(rb'"((?:[^"\\]|\\.){1,200})"\s*:\s*[\[\s]*-?(?:\d+\.?\d*|\.\d+)[eE][+-]?\d{3,}')


def _number_field(raw: bytes, default: str | None = "the request body") -> str | None:
    """The name of the member whose value is a number too large for a float, if a quick scan finds it.

    >>> _number_field(b'{"model": "m", "dimensions": 1e400}'), _number_field(b'[1e400]', None)
    ('dimensions', None)
    """
    match = _HUGE_NUMBER.search(raw)
    return match.group(1).decode("utf-8", "replace") if match else default


@functools.cache
def _clearing_fields(schema: Any) -> tuple[str, ...]:
    """The top-level fields of a modification's schema where null means "clear" rather than "absent": those
    whose default is ``UNSET`` (left out: unchanged) and whose type takes ``None``."""
    if not (isinstance(schema, type) and issubclass(schema, msgspec.Struct)):
        return ()
    return tuple(
        field.encode_name
        for field in msgspec.structs.fields(schema)
        if field.default is msgspec.UNSET and _takes_none(field.type)
    )


def _takes_none(annotation: Any) -> bool:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        return _takes_none(args[0])
    return annotation is type(None) or any(_takes_none(arg) for arg in args)


def _normalized(value: Any) -> Any:
    """``value`` with every float that has a zero fraction replaced by its int, and every object member whose
    value is null left out. JSON Schema's ``integer`` is "any number with a zero fractional part", so ``10.0``
    is a valid ``dimensions``, while msgspec's strict mode would refuse it; other floats stay floats (and an
    integer field then refuses them). A null member is an absent one.

    >>> _normalized({"a": [10.0, 2.5, "10", None], "b": 1e20, "c": None, "d": {"e": None}})
    {'a': [10, 2.5, '10', None], 'b': 100000000000000000000, 'd': {}}
    """
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items() if v is not None}
    return value
