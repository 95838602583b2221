"""Object ids in OpenAI's style: a prefix naming the kind (``file-``, ``batch_``, ``vs_``) and 24 random hex digits."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    """A fresh id of the kind ``prefix`` names (``new_id("batch_")``: ``batch_`` and 24 hex digits)."""
    return f"{prefix}{secrets.token_hex(12)}"
