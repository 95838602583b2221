"""Exception types of the core. The service maps each of them to an HTTP status in one place."""

from __future__ import annotations

from typing import Any


def shorten(value: Any, limit: int = 100) -> str:
    """``value`` as text, cut to ``limit`` characters with a note of the full length (for echoing input in a
    message).

    >>> shorten("x" * 150, 10)
    'xxxxxxxxxx… (150 characters)'
    """
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


class EmbedrankError(Exception):
    """Base class of every error raised on purpose by embedrank."""


class ModelNotFoundError(EmbedrankError):
    """A model id could not be resolved to weights (no package, no local directory, no hub)."""


class NotAModelError(EmbedrankError):
    """A path exists but does not hold a Hugging Face model."""


class ModelKindError(EmbedrankError):
    """A model of one kind (embedding, cross-encoder) was used where the other kind is needed."""


class UnsupportedModelError(EmbedrankError):
    """The model's own files ask for something embedrank does not implement."""


class ModelLoadError(EmbedrankError):
    """A model that was found could not be loaded (unreadable weights, a failed export, too little memory);
    the message names the model and says why."""


class ConfigurationError(EmbedrankError, ValueError):
    """A model entry cannot be served as configured (a precision its kind does not run in, a missing file)."""


class InvalidInputError(EmbedrankError, ValueError):
    """The caller passed input that cannot be processed (empty list, wrong type, bad option).

    ``param`` names the argument or request field at fault (``"dimensions"``, ``"documents"``), when known;
    the service reports it as the error's ``param``.
    """

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class InputTooLongError(InvalidInputError):
    """An input exceeds the model's maximum length and truncation was not allowed.

    ``param`` and ``index`` name the input (``documents`` and 2 for ``documents[2]``).
    """

    def __init__(self, message: str, *, param: str | None = None, index: int | None = None) -> None:
        super().__init__(message, param=param)
        self.index = index


class OutputNotAvailableError(InvalidInputError):
    """An output type the model does not give was asked for (``param``: the field that asked)."""


class RequestTooLargeError(InvalidInputError):
    """One request's work is over a documented bound (the service's ``max_request_tokens``): refused
    before any of it is queued. ``limit`` names the bound."""

    def __init__(self, message: str, *, param: str | None = None, limit: str = "max_request_tokens") -> None:
        super().__init__(message, param=param)
        self.limit = limit


class UnsupportedMediaError(InvalidInputError):
    """An input of a media type that is not accepted (an image format not decoded, a declared type that is
    not an image); ``param`` names the field."""


class DataNotFoundError(EmbedrankError, FileNotFoundError):
    """A dataset could not be found in the data directory."""


class IndexMismatchError(EmbedrankError):
    """An index was queried or loaded with a model/dimension/metric that differs from the one it was built with."""


class IndexTrainingError(EmbedrankError):
    """An IVF/PQ index cannot be trained with the vectors it was given."""


class OverloadedError(EmbedrankError):
    """The engine queue is full; retry later."""

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NotReadyError(EmbedrankError):
    """The engine is loading or draining."""


class ModelUnavailableError(NotReadyError):
    """A configured model could not be loaded when the service started (the others serve): asking again
    does not help until the service is restarted with the cause fixed. The message says why."""
