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

import dataclasses
import io
import json
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

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


def _utf8(content: bytes, filename: str) -> str:
    try:
        return content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidFileError(f"{filename[:100]!r} is not UTF-8 text (byte {exc.start})") from None


def read_documents(
    filename: str, content: bytes, *, max_pages: int = 500, max_chars: int = 10_000_000
) -> list[Document]:
    """The documents of a file named ``filename`` holding ``content`` (one, except for JSON Lines).

    >>> [d.text for d in read_documents("a.html", b"<html><script>x()</script><p>Hello <b>world</b></p></html>")]
    ['Hello world']
    >>> read_documents("c.jsonl", b'{"_id": "7", "title": "T", "text": "body"}\\n')[0]
    Document(text='T\\nbody', attributes={'_id': '7'})

    Raises:
        UnsupportedFileError: a type that is not read.
        InvalidFileError: content that is not of its type, or past ``max_pages`` or ``max_chars``.
    """
    kind = file_type(filename)
    if kind == "pdf":
        docs = [Document(_pdf_text(content, filename, max_pages, max_chars))]
    elif kind == "html":
        docs = [Document(_html_text(content, filename))]
    elif kind == "jsonl":
        docs = _jsonl_documents(_utf8(content, filename), filename)
    else:
        text = _utf8(content, filename)
        if kind == "json":
            try:
                json.loads(text)
            except ValueError as exc:
                raise InvalidFileError(f"{filename[:100]!r} is not JSON: {exc}") from None
            except RecursionError:
                raise InvalidFileError(f"{filename[:100]!r} nests too deeply to be read as JSON") from None
        docs = [Document(text)]
    docs = [_without_nul(d) for d in docs]
    chars = sum(len(d.text) for d in docs)
    if chars > max_chars:
        raise InvalidFileError(f"{filename[:100]!r} holds {chars} characters of text; the limit is {max_chars}")
    return docs


def _without_nul(doc: Document) -> Document:
    """``doc`` with its NUL characters (U+0000: no text, and what a PostgreSQL text column cannot hold) removed from
    its text and its attributes."""

    def clean(value: Any) -> Any:
        return value.replace("\x00", "") if isinstance(value, str) else value

    if "\x00" not in doc.text and not any("\x00" in k or "\x00" in str(v) for k, v in doc.attributes.items()):
        return doc
    return Document(clean(doc.text), {clean(k): clean(v) for k, v in doc.attributes.items()})


def _jsonl_documents(text: str, filename: str) -> list[Document]:
    docs = []
    for number, line in enumerate(text.split("\n"), start=1):
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
        docs.append(Document("\n".join(parts), attributes))
    return docs


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
