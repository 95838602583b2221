"""Query and document prompts, as sentence-transformers stores and applies them.

A model's ``config_sentence_transformers.json`` may name prompts (``{"query": "query: ", "passage":
"passage: "}``) and a ``default_prompt_name``. A prompt is text put before every input, and the model sees
(and counts) its tokens like the input's. :func:`select_prompt` picks the one a call asks for;
:data:`QUERY_NAMES` and :data:`DOCUMENT_NAMES` are the names ``encode_query`` and ``encode_document`` look
for, in order, as sentence-transformers 5 does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from embedrank.errors import InvalidInputError

QUERY_NAMES = ("query",)
DOCUMENT_NAMES = ("document", "passage", "corpus")
# the service's ``input_type`` (ours, and Cohere's names) -> the prompt names it looks for, in order
INPUT_TYPES: dict[str, tuple[str, ...]] = {
    "query": QUERY_NAMES,
    "search_query": QUERY_NAMES,
    "document": DOCUMENT_NAMES,
    "search_document": DOCUMENT_NAMES,
    "classification": ("classification",),
    "clustering": ("clustering",),
}


def select_prompt(
    prompts: Mapping[str, str],
    default_prompt_name: str | None = None,
    *,
    prompt_name: str | None = None,
    prompt: str | None = None,
) -> str:
    """The text to put before each input: ``prompt`` itself, the prompt named ``prompt_name``, or the
    model's default prompt (``""`` when it has none).

    >>> prompts = {"query": "query: ", "passage": "passage: "}
    >>> select_prompt(prompts, prompt_name="query"), select_prompt(prompts, prompt="Represent: ")
    ('query: ', 'Represent: ')
    >>> select_prompt(prompts), select_prompt(prompts, "passage")
    ('', 'passage: ')
    >>> select_prompt(prompts, prompt_name="doc")
    Traceback (most recent call last):
    ...
    embedrank.errors.InvalidInputError: unknown prompt_name 'doc'; this model's prompts: ['passage', 'query']
    """
    if prompt is not None and prompt_name is not None:
        raise InvalidInputError("give prompt or prompt_name, not both", param="prompt_name")
    if prompt is not None:
        return prompt
    name = prompt_name if prompt_name is not None else default_prompt_name
    if name is None:
        return ""
    if name not in prompts:
        listed = sorted(prompts) if prompts else "none"
        raise InvalidInputError(f"unknown prompt_name {name!r}; this model's prompts: {listed}", param="prompt_name")
    return prompts[name]


def first_present(prompts: Mapping[str, str], names: Sequence[str]) -> str | None:
    """The first of ``names`` that ``prompts`` has, or None (then the default prompt applies).

    >>> first_present({"passage": "p: "}, DOCUMENT_NAMES), first_present({}, QUERY_NAMES)
    ('passage', None)
    """
    return next((n for n in names if n in prompts), None)


def role_prompt(prompts: Mapping[str, str], default_prompt_name: str | None, names: Sequence[str]) -> str:
    """The prompt text for a role (``names`` is :data:`QUERY_NAMES` or :data:`DOCUMENT_NAMES`): the first
    of ``names`` the model has, else its default prompt, else ``""``.

    >>> role_prompt({"query": "q: "}, None, QUERY_NAMES), role_prompt({"query": "q: "}, None, DOCUMENT_NAMES)
    ('q: ', '')
    """
    return select_prompt(prompts, default_prompt_name, prompt_name=first_present(prompts, names))


def request_prompt(
    prompts: Mapping[str, str],
    default_prompt_name: str | None,
    *,
    input_type: str | None = None,
    prompt_name: str | None = None,
) -> str:
    """The prompt an embeddings request selects: by ``prompt_name`` (must exist), or by ``input_type``
    (:data:`INPUT_TYPES`; the model's default prompt when it has no prompt for that type), or the default.

    Examples:
        >>> prompts = {"query": "query: ", "passage": "passage: "}
        >>> [request_prompt(prompts, None, input_type=t) for t in ("search_query", "document", "clustering")]
        ['query: ', 'passage: ', '']
    """
    if prompt_name is not None and input_type is not None:
        raise InvalidInputError("give input_type or prompt_name, not both", param="prompt_name")
    if input_type is not None:
        if input_type not in INPUT_TYPES:
            raise InvalidInputError(
                f"unknown input_type {input_type!r}; one of {sorted(INPUT_TYPES)}", param="input_type"
            )
        return role_prompt(prompts, default_prompt_name, INPUT_TYPES[input_type])
    return select_prompt(prompts, default_prompt_name, prompt_name=prompt_name)


def with_prompt(texts: Sequence[str], prompt: str) -> list[str]:
    """``prompt + text`` for each text, as sentence-transformers builds the model's input."""
    return [prompt + t for t in texts] if prompt else list(texts)
