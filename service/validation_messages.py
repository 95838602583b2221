"""msgspec's validation messages (``Expected `int`, got `str` - at `$.top_n```) read once, for the two places
that reword them for their readers: request bodies (:func:`service.errors.validation_error`, JSON words) and
the settings (:mod:`service.settings`, TOML and environment words)."""

from __future__ import annotations

import re

_AT = re.compile(r"^(?P<detail>.*?)(?: - at (?P<key>`key` in )?`\$\.?(?P<path>[^`]*)`)?$", re.S)


def split_at(message: str) -> tuple[str, str | None]:
    """``(what is wrong, where)`` of a msgspec validation message; where is the path after ``$.`` (``""``
    for the document itself) or None when the message names no place.

    >>> split_at("Expected `int`, got `str` - at `$.models[0].id`")
    ('Expected `int`, got `str`', 'models[0].id')
    >>> split_at("Object missing required field `model`")
    ('Object missing required field `model`', None)
    >>> split_at("Expected `str` of length <= 64 - at `key` in `$.attributes`")  # a mapping's key: the mapping
    ('Expected `str` of length <= 64 (a key)', 'attributes')
    """
    match = _AT.match(message)
    assert match is not None  # the pattern matches any text
    return match["detail"] + (" (a key)" if match["key"] else ""), match["path"]


def reworded(detail: str, words: dict[str, str]) -> str:
    """``detail`` with msgspec's type names (``int``, ``array``, ...) in the reader's ``words``.

    >>> reworded("Expected `int`, got `str`", {"int": "an integer", "str": "text"})
    'Expected an integer, got text'
    """
    return re.sub(r"`(\w+)`", lambda m: words.get(m[1], m[0]), detail)
