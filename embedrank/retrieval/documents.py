"""The text of an uploaded file, by its type (its name's extension): plain text and Markdown as they are, JSON as
its text, JSON Lines as one document a line, HTML's visible text (lxml), and PDF's text layer (pypdf).

A JSON Lines file is a collection: each line is an object that becomes a document of its own, its text the
``title`` and ``text`` fields (BEIR's corpus layout; a line with neither is refused) and its other scalar
fields (``_id``, ``year``, ...: strings, numbers, booleans) its attributes, so a search result names the line it came
from; a field holding ``null``, a list or an object is no attribute (filters compare scalars).

Every reader is bounded: text must be UTF-8 (a BOM is dropped), a PDF has at most ``max_pages`` pages, and the
text of a file at most ``max_chars`` characters; past a bound the file is refused, never cut. NUL characters
(U+0000), which are no text, are removed from every document's text and attributes.
"""

from __future__ import annotations

import codecs
import dataclasses
import io
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import PurePath
from typing import Any, BinaryIO, NamedTuple

from embedrank.errors import EmbedrankError

TEXT_TYPES = {".txt": "text", ".text": "text", ".md": "markdown", ".markdown": "markdown", ".json": "json"}
TYPES = {**TEXT_TYPES, ".jsonl": "jsonl", ".html": "html", ".htm": "html", ".pdf": "pdf"}
"""The extensions read, and their type."""

MAX_HTML_DEPTH = 2048
"""How deep an HTML file's elements may nest (libxml2's limit with its large documents allowed)."""
MAX_ATTRIBUTE_KEY = 64
MAX_ATTRIBUTE_VALUE = 512


class UnsupportedFileError(EmbedrankError):
    """A file whose type is not read (its name's extension is none of :data:`TYPES`)."""

    code = "unsupported_file"


class InvalidFileError(EmbedrankError):
    """A file of a type that is read whose content is not of that type, or past a bound."""

    code = "invalid_file"


@dataclasses.dataclass(frozen=True)
class Document:
    """One document of a file: its text and its own attributes (a JSON Lines line's fields; empty otherwise)."""

    text: str
    attributes: Mapping[str, str | int | float | bool] = dataclasses.field(default_factory=dict)


def file_type(filename: str) -> str:
    """The type of a file named ``filename``.

    >>> file_type("notes.MD"), file_type("corpus.jsonl")
    ('markdown', 'jsonl')

    Raises:
        UnsupportedFileError: an extension none of :data:`TYPES`.
    """
    suffix = PurePath(filename).suffix.lower()
    if suffix not in TYPES:
        raise UnsupportedFileError(
            f"{filename[:100]!r}: files of type {suffix or '(no extension)'!r} are not read; "
            f"the types read are {', '.join(sorted(TYPES))}"
        )
    return TYPES[suffix]


def _utf8(content: bytes, filename: str, offset: int = 0) -> str:
    try:
        return content.decode("utf-8-sig" if offset == 0 else "utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidFileError(f"{filename[:100]!r} is not UTF-8 text (byte {offset + exc.start})") from None


class Piece(NamedTuple):
    """A part of one document's text, as :func:`stream_documents` gives it: a document's pieces come in order, the
    first with ``first`` and the document's attributes, the last with ``last`` (a short document's only piece has
    both)."""

    text: str
    first: bool
    last: bool
    attributes: Mapping[str, str | int | float | bool]


PIECE_CHARS = 1 << 20
"""Characters of text one :class:`Piece` holds at most."""
BLOCK_BYTES = 1 << 20
"""Bytes of a plain-text file read at a time."""


def read_documents(
    filename: str, content: bytes, *, max_pages: int = 500, max_chars: int = 10_000_000
) -> list[Document]:
    """The documents of a file named ``filename`` holding ``content`` (one, except for JSON Lines): the pieces of
    :func:`stream_documents`, joined.

    >>> [d.text for d in read_documents("a.html", b"<html><script>x()</script><p>Hello <b>world</b></p></html>")]
    ['Hello world']
    >>> read_documents("c.jsonl", b'{"_id": "7", "title": "T", "text": "body"}\\n')[0]
    Document(text='T\\nbody', attributes={'_id': '7'})

    Raises:
        UnsupportedFileError: a type that is not read.
        InvalidFileError: content that is not of its type, or past ``max_pages`` or ``max_chars``.
    """
    return joined(stream_documents(filename, io.BytesIO(content), max_pages=max_pages, max_chars=max_chars))


def joined(pieces: Iterable[Piece]) -> list[Document]:
    """The documents whose ``pieces`` are given, whole."""
    docs: list[Document] = []
    parts: list[str] = []
    attributes: Mapping[str, str | int | float | bool] = {}
    for piece in pieces:
        if piece.first:
            parts, attributes = [], piece.attributes
        parts.append(piece.text)
        if piece.last:
            docs.append(Document("".join(parts), attributes))
    return docs


def stream_documents(
    filename: str, source: BinaryIO, *, max_pages: int = 500, max_chars: int = 10_000_000
) -> Iterator[Piece]:
    """The documents of a file named ``filename`` read from ``source``, as pieces of at most :data:`PIECE_CHARS`
    characters: plain text and Markdown are read and decoded :data:`BLOCK_BYTES` at a time and JSON Lines a line at
    a time, so that reading them holds a piece (a line) and not the file; JSON, HTML and PDF are parsed whole, then
    given in pieces. NUL characters are removed, and the characters are counted as they are read: past
    ``max_chars`` the file is refused at once.

    >>> [p.text for p in stream_documents("a.txt", io.BytesIO(b"green\\x00 tea"))]
    ['green tea']

    Raises:
        UnsupportedFileError: a type that is not read.
        InvalidFileError: content that is not of its type, or past ``max_pages`` or ``max_chars``.
    """
    kind = file_type(filename)
    counted = _Counted(filename, max_chars)
    if kind in ("text", "markdown"):
        yield from counted.pieces(_text_blocks(source, filename), {})
    elif kind == "jsonl":
        for text, attributes in _jsonl_documents(source, filename):
            yield from counted.pieces(iter([text]), attributes)
    else:
        if kind == "pdf":
            text = _pdf_text(source.read(), filename, max_pages, max_chars)
        elif kind == "html":
            text = _html_text(source.read(), filename)
        else:
            text = _utf8(source.read(), filename)
            try:
                json.loads(text)
            except ValueError as exc:
                raise InvalidFileError(f"{filename[:100]!r} is not JSON: {exc}") from None
            except RecursionError:
                raise InvalidFileError(f"{filename[:100]!r} nests too deeply to be read as JSON") from None
        yield from counted.pieces(iter([text]), {})


class _Counted:
    """Cuts documents' texts into pieces, NUL removed, counting their characters against ``max_chars``."""

    def __init__(self, filename: str, max_chars: int) -> None:
        self.filename, self.max_chars, self.chars = filename, max_chars, 0

    def pieces(self, texts: Iterator[str], attributes: Mapping[str, Any]) -> Iterator[Piece]:
        """One document, whose text is the concatenation of ``texts``."""
        attributes = {_without_nul(k): _without_nul(v) for k, v in attributes.items()}
        first, waiting = True, ""
        for text in texts:
            text = _without_nul(text)
            self.chars += len(text)
            if self.chars > self.max_chars:
                raise InvalidFileError(
                    f"{self.filename[:100]!r} holds more than {self.max_chars} characters of text; the limit is "
                    f"{self.max_chars}"
                )
            waiting += text
            while len(waiting) > PIECE_CHARS:  # a piece is sent once the next one holds something
                yield Piece(waiting[:PIECE_CHARS], first, False, attributes if first else {})
                first, waiting = False, waiting[PIECE_CHARS:]
        yield Piece(waiting, first, True, attributes if first else {})


def _text_blocks(source: BinaryIO, filename: str) -> Iterator[str]:
    """A UTF-8 file's text, decoded :data:`BLOCK_BYTES` at a time (a BOM dropped)."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    offset = 0
    while True:
        block = source.read(BLOCK_BYTES)
        pending = len(decoder.getstate()[0])
        try:
            yield decoder.decode(block, final=not block)
        except UnicodeDecodeError as exc:
            raise InvalidFileError(
                f"{filename[:100]!r} is not UTF-8 text (byte {offset - pending + exc.start})"
            ) from None
        if not block:
            return
        offset += len(block)


def _without_nul(value: Any) -> Any:
    """``value`` with its NUL characters (U+0000: no text, and what a PostgreSQL text column cannot hold) removed,
    if it is a string."""
    return value.replace("\x00", "") if isinstance(value, str) and "\x00" in value else value


def _jsonl_documents(source: BinaryIO, filename: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each line's document (its text and attributes), a line read at a time."""
    offset = 0
    for number, raw in enumerate(source, start=1):
        line = _utf8(raw, filename, offset)
        offset += len(raw)
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise InvalidFileError(f"{filename[:100]!r} line {number} is not JSON: {exc}") from None
        except RecursionError:
            raise InvalidFileError(f"{filename[:100]!r} line {number} nests too deeply to be read as JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get("text", row.get("title")), str):
            raise InvalidFileError(f"{filename[:100]!r} line {number}: an object with a 'text' or 'title' string")
        parts = [row[name] for name in ("title", "text") if isinstance(row.get(name), str) and row[name]]
        attributes = {}
        for key, value in row.items():
            if key in ("title", "text") or not isinstance(value, str | int | float | bool):
                continue
            if len(key) > MAX_ATTRIBUTE_KEY or (isinstance(value, str) and len(value) > MAX_ATTRIBUTE_VALUE):
                raise InvalidFileError(
                    f"{filename[:100]!r} line {number}: field {key[:70]!r} is past the attribute bounds "
                    f"({MAX_ATTRIBUTE_KEY} characters a key, {MAX_ATTRIBUTE_VALUE} a value)"
                )
            attributes[key] = value
        yield "\n".join(parts), attributes


def _html_text(content: bytes, filename: str) -> str:
    """The visible text of an HTML page: scripts, styles and comments left out, whitespace collapsed."""
    import lxml.etree
    import lxml.html

    parser = lxml.html.HTMLParser(huge_tree=True)  # nesting to libxml2's 2,048 levels, not 256
    try:
        root = lxml.html.document_fromstring(content, parser=parser)
    except (lxml.etree.ParserError, ValueError) as exc:
        raise InvalidFileError(f"{filename[:100]!r} is not HTML: {exc}") from None
    if any(error.type_name == "ERR_RESOURCE_LIMIT" for error in parser.error_log):  # the parser dropped the rest
        raise InvalidFileError(
            f"{filename[:100]!r} nests its elements more than {MAX_HTML_DEPTH:,} deep; the text past that depth "
            "cannot be read"
        )
    for element in root.xpath("//script | //style | //noscript | //template"):
        element.drop_tree()
    return " ".join(root.text_content().split())


def _pdf_text(content: bytes, filename: str, max_pages: int, max_chars: int) -> str:
    """The text layer of a PDF, page by page (a scanned page without one gives no text); refused as soon as
    the pages read so far hold more than ``max_chars`` characters."""
    import pypdf
    from pypdf.errors import PyPdfError

    try:
        reader = pypdf.PdfReader(io.BytesIO(content))
        pages = len(reader.pages)
        if pages > max_pages:
            raise InvalidFileError(f"{filename[:100]!r} has {pages} pages; the limit is {max_pages}")
        texts, chars = [], 0
        for number, page in enumerate(reader.pages, start=1):
            texts.append(page.extract_text())
            chars += len(texts[-1]) + 2
            if chars > max_chars:
                raise InvalidFileError(
                    f"{filename[:100]!r} holds more than {max_chars} characters of text by its page {number} "
                    f"of {pages}; the limit is {max_chars}"
                )
        return "\n\n".join(texts)
    except InvalidFileError:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, OSError, RecursionError) as exc:
        raise InvalidFileError(
            f"{filename[:100]!r} is not a PDF that can be read: {type(exc).__name__}: {exc}"
        ) from None
