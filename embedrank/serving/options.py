"""What one request asks of a model, as one frozen object per call: :class:`EmbedOptions` for an embedding
call and :class:`RerankOptions` for a reranking call. Each carries every option of the call and the names the
request gave its fields (:class:`RequestFields`), so that an error cites the field the client sent: ``input``
for OpenAI's API, ``texts`` for Cohere's, ``inputs`` for TEI's.

A protocol builds the options once from its request; the hosted model resolves the prompt and the branch and
hands them to the runner of its kind; a runner refuses what does not apply to its kind with one declarative
check (:func:`refuse`).

>>> options = EmbedOptions(dimensions=8, fields=COHERE_FIELDS)
>>> refuse(options, Refusal("dimensions", "this model keeps its width"))
Traceback (most recent call last):
embedrank.errors.InvalidInputError: this model keeps its width
>>> refuse(EmbedOptions(), Refusal("dimensions", "this model keeps its width"))  # not given: nothing refused
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

from embedrank.errors import InvalidInputError
from embedrank.models.images import ImageLimits
from embedrank.types import Chunking


@dataclasses.dataclass(frozen=True, kw_only=True)
class RequestFields:
    """The request's own names for the options an error may cite (each defaults to OpenAI's name)."""

    texts: str = "input"
    dimensions: str = "dimensions"
    truncation_side: str = "truncation_direction"
    normalize: str = "normalize"
    input_type: str = "input_type"
    types: str = "embedding_types"
    chunking: str = "chunking"
    adapter: str = "adapter"
    task: str = "task"


OPENAI_FIELDS = RequestFields()
COHERE_FIELDS = RequestFields(texts="texts", dimensions="output_dimension", truncation_side="truncate")
TEI_FIELDS = RequestFields(texts="inputs")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EmbedOptions:
    """Every option of one embedding call.

        ``input_type`` / ``prompt_name`` select the prompt and the branch, ``adapter`` or jina's ``task`` a LoRA
        adapter (:meth:`HostedModel.resolve <embedrank.serving.hosting.HostedModel.resolve>`); ``types`` the outputs beyond the float vectors
        (``sparse``, ``multivector``, the compact types); ``dimensions`` cuts the dense vectors (then renormalized);
        a text longer than the window is cut at its end (``truncation_side="right"``) or its start (``"left"``), or
        refused when ``truncate`` is off; ``normalize`` overrides the model's own L2 normalization (None: the
        model's); ``chunking`` embeds long texts window by window and pools them; a lower ``priority`` is scheduled
        first; ``budget`` bounds the request's tokens and ``multi_budget`` its token vectors; ``cached``: texts
        embedded before come from the model's vector cache; ``image_limits`` bounds each image (None: the library's
    defaults); ``fields``: the request's names for these, for errors.
    """

    input_type: str | None = None
    prompt_name: str | None = None
    task: str | None = None
    adapter: str | None = None
    types: tuple[str, ...] = ()
    dimensions: int | None = None
    truncate: bool = True
    truncation_side: Literal["right", "left"] = "right"
    normalize: bool | None = None
    chunking: Chunking | None = None
    priority: int = 0
    budget: int | None = None
    multi_budget: int | None = None
    cached: bool = False
    image_limits: ImageLimits | None = None
    fields: RequestFields = OPENAI_FIELDS


EMBED_DEFAULTS = EmbedOptions()
"""An embedding call that asks for nothing but the vectors."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RerankOptions:
    """Every option of one reranking call: ``truncate`` off refuses a query or document cut at the window;
    ``chunking`` scores long documents window by window; ``raw_scores`` skips a cross-encoder's activation; a
    lower ``priority`` is scheduled first; ``budget`` bounds the request's tokens; ``top_n`` cuts the ranking;
    ``adapter`` names the cross-encoder's LoRA adapter that scores the pairs."""

    truncate: bool = True
    chunking: Chunking | None = None
    raw_scores: bool = False
    priority: int = 0
    budget: int | None = None
    top_n: int | None = None
    adapter: str | None = None


RERANK_DEFAULTS = RerankOptions()
"""A reranking call that asks for every score, truncating what is too long."""


def _given(value: Any) -> bool:
    return value is not None


@dataclasses.dataclass(frozen=True)
class Refusal:
    """An option a kind of model refuses: the :class:`EmbedOptions` attribute ``option``, refused with ``why``
    when ``given(value)`` holds (by default: when it is set at all)."""

    option: str
    why: str
    given: Callable[[Any], bool] = _given


def refuse(options: EmbedOptions, *refusals: Refusal) -> None:
    """Refuse the first of ``refusals`` that ``options`` asks for: a 400 naming the request's field.

    Raises:
        InvalidInputError: an option that does not apply to the model.
    """
    for refusal in refusals:
        if refusal.given(getattr(options, refusal.option)):
            raise InvalidInputError(refusal.why, param=getattr(options.fields, refusal.option))
