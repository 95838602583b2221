"""OpenTelemetry spans of the serving core: what a request's trace shows beside its server span.

Off until :func:`use` is given a tracer provider (the service does, when the standard ``OTEL_*`` variables ask
for traces: :mod:`service.tracing`); while off every function here returns at once and records nothing.

What is recorded, following OpenTelemetry's GenAI conventions where they apply:

- on the span current when a model is asked (the request's server span, or a batch line's span):
  ``gen_ai.request.model`` (the name the request used, :func:`note_model`), ``gen_ai.operation.name``
  (``embeddings``, or ``rerank`` for reranking, which the conventions do not name, :func:`note_operation`) and
  ``gen_ai.usage.input_tokens`` (:func:`note_usage`);
- ``embedrank.tokenize``: a child span while a request's texts are tokenized in a worker thread
  (:func:`tokenizing`); a few short texts tokenized on the event loop (microseconds, less than recording a
  span costs) get none;
- ``gen_ai.latency.time_in_queue`` (seconds, vLLM's attribute): on the same span, how long the request's items
  waited from being queued until the first of them went into a forward pass (:meth:`Queued.waited`; the longest
  wait when a request queues items more than once);
- ``embedrank.forward``: one span per forward pass of the engine (:func:`forward`), a child of the request
  whose item leads the batch, linked to every request with items in it.

So a request of a few short texts records one span of its own, its server span: the forward spans are one per
batch, shared. The engine's spans and attributes are recorded on the event loop once a forward pass is over, with
the times the forward thread took: the forward thread, which every request waits for, spends no time on tracing.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, Tracer, TracerProvider

OPERATION = "gen_ai.operation.name"
REQUEST_MODEL = "gen_ai.request.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"

_tracer: Tracer | None = None
_waits: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("embedrank_queue_waits", default=None)


def use(provider: TracerProvider | None) -> None:
    """Record spans through ``provider`` from now on (None: record nothing)."""
    global _tracer
    _tracer = provider.get_tracer("embedrank") if provider is not None else None


def tracer() -> Tracer | None:
    """The tracer spans are recorded with; None while tracing is off."""
    return _tracer


def _current() -> Span | None:
    """The current span if it records, else None (also while tracing is off)."""
    if _tracer is None:
        return None
    current = trace.get_current_span()
    return current if current.is_recording() else None


def note_model(model: str) -> None:
    """Name the model the current request asked for (``gen_ai.request.model``)."""
    if (current := _current()) is not None:
        current.set_attribute(REQUEST_MODEL, model)


def note_operation(operation: str) -> None:
    """Mark the current span as a GenAI ``operation`` (``embeddings``, ``rerank``)."""
    if (current := _current()) is not None:
        current.set_attribute(OPERATION, operation)


def note_usage(input_tokens: int) -> None:
    """The tokens the current operation's inputs cost (what the response's usage reports)."""
    if (current := _current()) is not None:
        current.set_attribute(INPUT_TOKENS, input_tokens)


def note_queue_wait(seconds: float, request: Span | None = None) -> None:
    """Record ``seconds`` of queue wait on ``request`` (default: the current span), as
    ``gen_ai.latency.time_in_queue``; a request that waited more than once keeps its longest wait."""
    request = request if request is not None else _current()
    if request is None or not request.is_recording():
        return
    before = (getattr(request, "attributes", None) or {}).get(TIME_IN_QUEUE)
    if before is None or seconds > before:
        request.set_attribute(TIME_IN_QUEUE, seconds)


def collect_queue_waits() -> list[float]:
    """A list that receives, from now on in this task's context, the queue waits of requests whose span is in
    another process (:mod:`embedrank.serving.remote` sends them back to be recorded there)."""
    waits: list[float] = []
    _waits.set(waits)
    return waits


@contextlib.contextmanager
def span(name: str, attributes: dict[str, Any] | None = None) -> Iterator[None]:
    """A child span of the current one around the block (nothing while tracing is off)."""
    if _tracer is None:
        yield
        return
    with _tracer.start_as_current_span(name, attributes=attributes):
        yield


def tokenizing(texts: int) -> contextlib.AbstractContextManager[None]:
    """The span of a request's tokenization of ``texts`` texts (or pairs)."""
    return span("embedrank.tokenize", {"embedrank.tokenize.texts": texts})


class Queued:
    """What the engine keeps of a request to trace it: the context it was submitted in and when."""

    __slots__ = ("began_ns", "context", "queued_ns", "recorded", "waits")

    def __init__(self) -> None:
        self.context = otel_context.get_current()
        self.waits = _waits.get()  # where the wait goes when the request's span is another process's
        self.queued_ns = time.time_ns()
        self.began_ns = 0  # when its first item went into a forward pass (set by the forward thread)
        self.recorded = False  # whether its queue wait is recorded

    def span_context(self) -> trace.SpanContext:
        return trace.get_current_span(self.context).get_span_context()

    def waited(self) -> None:
        """Record the request's queue wait on its span, once (``gen_ai.latency.time_in_queue``, seconds): from its
        submission until its first item went into a forward pass. A request that queued items before keeps its
        longest wait; one that has ended (its client went) records nothing; one whose span is in another process
        has its wait collected (:func:`collect_queue_waits`) to be recorded there."""
        if self.recorded or _tracer is None or not self.began_ns:
            return
        self.recorded = True
        seconds = (self.began_ns - self.queued_ns) / 1e9
        request = trace.get_current_span(self.context)
        if request.is_recording():
            note_queue_wait(seconds, request)
        elif self.waits is not None and request.get_span_context().is_remote:
            self.waits.append(seconds)  # sent back to the process that holds the request's span


def queued() -> Queued | None:
    """A new request's :class:`Queued`, when tracing is on and it is part of a recorded trace: its span records
    here, or it came from another process (:mod:`embedrank.serving.remote`) in a sampled trace."""
    if _tracer is None:
        return None
    current = trace.get_current_span()
    parent = current.get_span_context()
    return Queued() if current.is_recording() or (parent.is_remote and parent.trace_flags.sampled) else None


def forward(
    requests: Sequence[Queued], attributes: dict[str, Any], began_ns: int, ended_ns: int, error: BaseException | None
) -> None:
    """Record one forward pass over items of ``requests`` (those traced; the first leads the batch), which ran
    from ``began_ns`` to ``ended_ns`` and failed with ``error`` (or not): each request's queue wait on its span
    (:meth:`Queued.waited`), then the pass's span, a child of the first request's span, linked to each of
    them. Nothing without a traced request."""
    if _tracer is None or not requests:
        return
    for request in requests:
        request.waited()
    links = [Link(r.span_context()) for r in requests]
    forward_span = _tracer.start_span(
        "embedrank.forward", context=requests[0].context, links=links, attributes=attributes, start_time=began_ns
    )
    if error is not None:  # its type only: a message may quote an input
        forward_span.set_status(trace.StatusCode.ERROR, type(error).__name__)
    forward_span.end(end_time=ended_ns)
