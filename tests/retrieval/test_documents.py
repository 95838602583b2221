"""A file's documents as the library reads them (:func:`~embedrank.retrieval.documents.read_documents`): what
a file holds is read whole or refused with the reason, never cut unsaid."""

from __future__ import annotations

import json

import pytest

from embedrank.retrieval.documents import MAX_HTML_DEPTH, InvalidFileError, read_documents

pytestmark = pytest.mark.kernel_free


def nested_html(depth: int) -> bytes:
    return b"<html><body>" + b"<div>" * depth + b"deep text" + b"</div>" * depth + b"</body></html>"


def test_html_nested_past_256_levels_is_read_whole_and_past_the_limit_refused():
    assert [d.text for d in read_documents("a.html", nested_html(300))] == ["deep text"]  # libxml2's default: ""
    with pytest.raises(InvalidFileError, match=f"more than {MAX_HTML_DEPTH:,} deep"):
        read_documents("b.html", nested_html(MAX_HTML_DEPTH + 100))


def test_nul_characters_are_removed_from_text_and_attributes():
    assert [d.text for d in read_documents("a.txt", b"green\x00 tea")] == ["green tea"]
    line = json.dumps({"text": "black\x00 coffee", "src\x00": "me\x00nu", "year": 2024}) + "\n"
    (doc,) = read_documents("b.jsonl", line.encode())
    assert doc.text == "black coffee" and doc.attributes == {"src": "menu", "year": 2024}
