"""Batching engines served to other processes: :class:`EngineHost` offers a process's
:class:`~embedrank.serving.engine.BatchEngine` objects on a Unix socket, and :class:`EngineLink` submits to them from
another process, with :class:`RemoteEngine` as the ``submit`` of one of them. Every process that submits shares the
host's engines, so one fair queue (:mod:`embedrank.serving.scheduler`) orders the work of all of them, and one
engine's estimated wait decides what is refused.

What crosses, in frames of MessagePack (a 4-byte length, then the message), never JSON or a pickle:

- a submission: its id, the engine's name, its priority, its items (tokenized rows: the model's token lists,
  length, whether cut, pooling skip; an image-text model's images as the pixel arrays the front's processor made of
  them, so that no image is decoded in the engine's process), and the request's id and W3C
  ``traceparent``, so that the forward pass's span joins the request's trace;
- an answer: the :class:`~embedrank.types.ModelOutput`, its arrays as raw buffers (dtype, shape, bytes), object
  arrays item by item, SciPy sparse rows as their three arrays; for a traced submission, its queue wait, which the
  submitting process records on the request's span;
- a refusal: the error's kind (``overloaded`` with its Retry-After, ``invalid``, ``not_ready``, ``failed``) and
  message, raised again in the submitting process as the same :mod:`embedrank.errors` class;
- a cancellation: a submitter that stops waiting (its client went) has its items dropped from the queue, as
  in-process; a connection that closes cancels all of its submissions;
- a description (:class:`Description`): what another process needs to serve the host's models without their
  weights (the runtimes, batch bounds, measured widths, range samples' embeddings, the models that failed);
- figures: a process leaves its own with the host (:class:`Report`, opaque bytes), and a :class:`Scrape` gets the
  host's and every other process's last ones (a replica's ``/metrics``);
- a call (:class:`Call`): work that the host's process keeps for itself, under a name it registered
  (:meth:`EngineHost.answer`), run on MessagePack arguments and answered by its value (:class:`Returned`) or a
  refusal; a replica's searches of its vector stores, whose indexes its engine process holds once for every front.

When the host cannot be reached, or its connection ends while a submission waits, :meth:`EngineLink.submit` raises
:class:`~embedrank.errors.NotReadyError` at once (an HTTP front answers 503 with Retry-After); the next submission
connects again.

>>> import asyncio, tempfile, os
>>> from embedrank.serving.engine import BatchEngine
>>> from embedrank.serving.runners import EmbeddingBatchModel
>>> from embedrank.testing.fake import FakeEncoder
>>> async def demo():
...     path = os.path.join(tempfile.mkdtemp(), "engine.sock")
...     model = FakeEncoder(dimension=4)
...     engine = BatchEngine(EmbeddingBatchModel(model))
...     engine.start()
...     host = EngineHost({"enc": engine})
...     await host.serve(path)
...     link = EngineLink(path)
...     out = await link.engine("enc").submit(model.tokenize_rows(["hello world"]))
...     await link.close()
...     await host.close()
...     await engine.drain()
...     return out.values.shape, out.values.dtype, out.token_counts
>>> asyncio.run(demo())
((1, 4), dtype('float32'), [4])
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import struct
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

import msgspec
import numpy as np
import scipy.sparse as sp
import torch
from opentelemetry import context as otel_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from embedrank.errors import InvalidInputError, NotReadyError, OverloadedError
from embedrank.models.image_text import ImageRow
from embedrank.models.m3 import M3Row
from embedrank.models.tokens import TokenRow
from embedrank.serving import tracing
from embedrank.serving.engine import BatchEngine
from embedrank.serving.image_text import ImageInput
from embedrank.serving.late import Held
from embedrank.types import ModelOutput

logger = logging.getLogger("embedrank.serving")

MAX_FRAME = 1 << 30
"""The largest message either side accepts (bytes): a request's items are bounded far below it by the service's
limits; a larger frame means a broken peer, and ends the connection."""

_LENGTH = struct.Struct("!I")
_ARRAY, _OBJECTS, _HELD, _CSR, _ROW, _IMAGE, _M3_ROW, _IMAGE_ROW = range(1, 9)  # MessagePack extension codes
_PROPAGATOR = TraceContextTextMapPropagator()


# -- messages ----------------------------------------------------------------------------------------------------------
class Submit(msgspec.Struct, tag="submit", array_like=True):
    id: int
    engine: str
    priority: int
    items: list[Any]
    request_id: str | None = None
    traceparent: str | None = None


class Cancel(msgspec.Struct, tag="cancel", array_like=True):
    id: int


class Answer(msgspec.Struct, tag="answer", array_like=True):
    id: int
    values: Any
    token_counts: list[int]
    truncated: list[bool]
    time_in_queue: float | None = None  # seconds, when the submission was traced


class Refused(msgspec.Struct, tag="refused", array_like=True):
    id: int
    kind: str  # overloaded, invalid, not_ready, failed
    message: str
    retry_after: float | None = None
    param: str | None = None


class EngineFacts(msgspec.Struct, array_like=True):
    """What a front process cannot know of one engine (a model, or a Router model's branch) without its weights."""

    max_batch_tokens: int  # the bounds of a forward pass
    max_batch_size: int
    backend: str  # what runs this part (a Router model's static branch runs torch whatever the others run)
    precision: str
    inference_precision: str
    width: int | None = None  # the encoder's embedding width, where it was measured
    range_embeddings: Any = None  # (N, D) float32: the int8/uint8 range sample's embeddings, for a dense model


class ModelFacts(msgspec.Struct, array_like=True):
    """What really runs a model in the engine process, as the model's description says it."""

    backend: str
    precision: str
    inference_precision: str
    fallback_reason: str | None = None
    auto_choice: str | None = None  # the summary of what auto chose and why


class Describe(msgspec.Struct, tag="describe", array_like=True):
    id: int


class Description(msgspec.Struct, tag="description", array_like=True):
    """The host's models once they are served: each model's facts by id, each engine's by label (``id`` or
    ``id:branch``), and the models that could not be loaded with why (``on_model_failure = "serve-others"``)."""

    id: int
    models: dict[str, ModelFacts]
    engines: dict[str, EngineFacts]
    failed: dict[str, str] = {}


class Report(msgspec.Struct, tag="report", array_like=True):
    """A submitting process's own figures (opaque bytes: the service's Prometheus exposition) and whether it is
    ready to answer, kept by the host under ``source`` until the next report, for :class:`Scrape` and
    :meth:`EngineHost.ready_sources`; no answer."""

    source: str
    text: bytes
    ready: bool = True


class Scrape(msgspec.Struct, tag="scrape", array_like=True):
    """Ask for the host's own figures and every other process's last :class:`Report` (``except_source``'s left
    out: the asker has fresher ones)."""

    id: int
    except_source: str = ""


class Scraped(msgspec.Struct, tag="scraped", array_like=True):
    """The figures of every process: ``(source, text, alive)``, the host's own first (source ``engine``); a
    process whose connection ended is not alive (its counters still count, its gauges no longer do)."""

    id: int
    reports: list[tuple[str, bytes, bool]]


class Call(msgspec.Struct, tag="call", array_like=True):
    """Run the host process's call ``name`` (:meth:`EngineHost.answer`) on ``args`` (MessagePack values; arrays and
    sparse matrices as for a submission); answered by :class:`Returned` or a :class:`Refused`."""

    id: int
    name: str
    args: Any
    request_id: str | None = None
    traceparent: str | None = None


class Returned(msgspec.Struct, tag="returned", array_like=True):
    id: int
    value: Any


Message = Submit | Cancel | Answer | Refused | Describe | Description | Report | Scrape | Scraped | Call | Returned


# -- the codec: arrays as raw buffers ----------------------------------------------------------------------------------
def _lift(value: Any) -> Any:
    """``value`` with the types MessagePack would write as plain maps (msgspec writes a dataclass as its fields) made
    extensions, so that they come back as themselves: a tokenized row, an image input, a held value."""
    if isinstance(value, TokenRow):
        row = (value.tokens, value.length, value.truncated, value.skip, value.adapter)
        return msgspec.msgpack.Ext(_ROW, _ENCODER.encode(row))
    if isinstance(value, ImageInput):
        return msgspec.msgpack.Ext(_IMAGE, _ENCODER.encode((value.source, value.field, value.at)))
    if isinstance(value, Held):
        return msgspec.msgpack.Ext(_HELD, _ENCODER.encode(_lift(value.value)))
    if isinstance(value, M3Row):
        return msgspec.msgpack.Ext(_M3_ROW, _ENCODER.encode((value.cls_state, value.lexical, value.multi)))
    if isinstance(value, ImageRow):  # a front's preprocessed image: its pixel tensors as raw arrays
        pixels = {name: tensor.numpy() for name, tensor in value.pixels.items()}
        return msgspec.msgpack.Ext(_IMAGE_ROW, _ENCODER.encode((pixels, value.length, value.truncated)))
    return value


def _enc_hook(value: Any) -> Any:
    """What MessagePack cannot hold itself, as extensions: a numeric array as dtype, shape and its bytes; an object
    array item by item; a CSR matrix as its three arrays."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            items = [_lift(item) for item in value.ravel().tolist()]
            return msgspec.msgpack.Ext(_OBJECTS, _ENCODER.encode((list(value.shape), items)))
        array = np.ascontiguousarray(value)
        head = _ENCODER.encode((array.dtype.str, list(array.shape)))
        return msgspec.msgpack.Ext(_ARRAY, _LENGTH.pack(len(head)) + head + array.tobytes())
    if isinstance(value, np.generic):
        return value.item()
    if sp.issparse(value):
        csr = sp.csr_matrix(value)
        return msgspec.msgpack.Ext(_CSR, _ENCODER.encode((csr.data, csr.indices, csr.indptr, list(csr.shape))))
    name = type(value).__name__
    raise TypeError(f"{'an' if name[0] in 'AEIOU' else 'a'} {name} cannot be sent to an engine in another process")


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == _ARRAY:
        (size,) = _LENGTH.unpack_from(data)
        dtype, shape = _DECODER.decode(data[4 : 4 + size])
        return np.frombuffer(data[4 + size :], dtype=np.dtype(dtype)).reshape(shape).copy()
    if code == _OBJECTS:
        shape, items = _DECODER.decode(data)
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out.reshape(shape)
    if code == _HELD:
        return Held(_DECODER.decode(data))
    if code == _CSR:
        values, indices, indptr, shape = _DECODER.decode(data)
        return sp.csr_matrix((values, indices, indptr), shape=tuple(shape))
    if code == _ROW:
        tokens, length, truncated, skip, adapter = _DECODER.decode(data)
        return TokenRow(tokens, length, truncated, skip, adapter)
    if code == _IMAGE:
        source, field, at = _DECODER.decode(data)
        return ImageInput(source, field, at)
    if code == _M3_ROW:
        cls_state, lexical, multi = _DECODER.decode(data)
        return M3Row(cls_state, lexical, multi)
    if code == _IMAGE_ROW:
        pixels, length, truncated = _DECODER.decode(data)
        return ImageRow({name: torch.from_numpy(array) for name, array in pixels.items()}, length, truncated)
    raise ValueError(f"unknown extension {code} in a message from an engine's peer")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_DECODER = msgspec.msgpack.Decoder(ext_hook=_ext_hook)
_MESSAGES = msgspec.msgpack.Decoder(Message, ext_hook=_ext_hook)


def encode(message: Message) -> bytes:
    """``message`` as one frame: its length, then its MessagePack.

    >>> row = TokenRow({"input_ids": [101, 7, 102]}, 3, False)
    >>> frame = encode(Submit(1, "enc", 0, [row]))
    >>> decode(frame[4:]).items[0] == row
    True
    >>> answer = decode(encode(Answer(1, np.arange(6, dtype=np.float32).reshape(2, 3), [3, 3], [False, False]))[4:])
    >>> answer.values.dtype, answer.values.shape, answer.values[1].tolist()
    (dtype('float32'), (2, 3), [3.0, 4.0, 5.0])
    """
    if isinstance(message, Submit):
        message = msgspec.structs.replace(message, items=[_lift(item) for item in message.items])
    elif isinstance(message, Answer):
        message = msgspec.structs.replace(message, values=_lift(message.values))
    body = _ENCODER.encode(message)
    return _LENGTH.pack(len(body)) + body


def decode(body: bytes | memoryview) -> Message:
    """One frame's message (its length already read)."""
    return _MESSAGES.decode(body)


async def _read(reader: asyncio.StreamReader) -> Message:
    """The next message on ``reader``.

    Raises:
        asyncio.IncompleteReadError: the connection ended.
        ValueError: a frame over :data:`MAX_FRAME` or one that does not decode: a broken peer.
    """
    (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if size > MAX_FRAME:
        raise ValueError(f"a frame of {size} bytes exceeds the {MAX_FRAME} an engine's peer may send")
    return decode(await reader.readexactly(size))


def refusal(job: int, exc: BaseException) -> Refused:
    """How ``exc``, raised by a submission's engine, crosses back."""
    if isinstance(exc, OverloadedError):
        return Refused(job, "overloaded", str(exc), retry_after=exc.retry_after)
    if isinstance(exc, InvalidInputError):
        return Refused(job, "invalid", str(exc), param=exc.param)
    if isinstance(exc, NotReadyError):
        return Refused(job, "not_ready", str(exc))
    return Refused(job, "failed", f"{type(exc).__name__}: {exc}")


class EngineFailedError(RuntimeError):
    """A forward pass in the engine's process failed (its type and message, never its traceback, cross over)."""


def raised(refused: Refused) -> Exception:
    """The exception a :class:`Refused` stands for, in the submitting process."""
    if refused.kind == "overloaded":
        return OverloadedError(refused.message, retry_after=refused.retry_after or 1.0)
    if refused.kind == "invalid":
        return InvalidInputError(refused.message, param=refused.param)
    if refused.kind == "not_ready":
        return NotReadyError(refused.message)
    return EngineFailedError(refused.message)


# -- the host: the engines' process ------------------------------------------------------------------------------------
class EngineHost:
    """Serves ``engines`` (by name) on a Unix socket to any number of processes. Create and serve it on the event
    loop the engines deliver their results on."""

    def __init__(
        self,
        engines: Mapping[str, BatchEngine[Any]],
        description: Description | None = None,
        *,
        exposition: Callable[[], bytes] = lambda: b"",
    ) -> None:
        self.engines = dict(engines)
        self.description = description  # what a Describe is answered with; None: not served yet (not_ready)
        self.exposition = exposition  # this process's own figures, for a Scrape (called in a worker thread)
        self.reports: dict[str, tuple[bytes, bool]] = {}  # each process's last Report, and whether it is connected
        self.ready: dict[str, bool] = {}  # whether each process's last Report said it was ready
        self.calls: dict[str, Callable[[Any], Awaitable[Any]]] = {}  # the process's own calls, by name (answer)
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}  # each one's writer
        self._jobs: set[asyncio.Task[None]] = set()  # submissions being answered, of every connection

    def waiting(self) -> int:
        """Submissions of every connection not answered yet."""
        return len(self._jobs)

    def ready_sources(self) -> list[str]:
        """The reporting processes still connected whose last :class:`Report` said they were ready."""
        return [s for s, (_, alive) in self.reports.items() if alive and self.ready.get(s, False)]

    def answer(self, name: str, call: Callable[[Any], Awaitable[Any]]) -> None:
        """Answer a :class:`Call` named ``name`` with ``await call(args)``: its value crosses back, an exception
        as a refusal (:func:`refusal`), and a caller that stops waiting has it cancelled."""
        self.calls[name] = call

    async def serve(self, path: str) -> None:
        """Listen on the Unix socket ``path`` (replaced if it exists)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._server = await asyncio.start_unix_server(self._connection, path=path, limit=1 << 20)

    async def close(self) -> None:
        """Stop listening and end every connection (their submissions are cancelled)."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._connections.values()):  # each connection's read ends: its submissions are dropped
            writer.close()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        current = asyncio.current_task()
        assert current is not None
        self._connections[current] = writer
        jobs: dict[int, asyncio.Task[None]] = {}
        sources: set[str] = set()  # what this connection reported as
        try:
            while True:
                message = await _read(reader)
                if isinstance(message, Submit):
                    task = asyncio.create_task(self._answer(message, writer))
                    jobs[message.id] = task
                    self._jobs.add(task)
                    task.add_done_callback(functools.partial(self._answered, jobs, message.id))
                elif isinstance(message, Cancel) and (cancelled := jobs.get(message.id)) is not None:
                    cancelled.cancel()
                elif isinstance(message, Describe):
                    writer.write(encode(self._described(message.id)))
                elif isinstance(message, Report):
                    self.reports[message.source] = (message.text, True)
                    self.ready[message.source] = message.ready
                    sources.add(message.source)
                elif isinstance(message, Scrape):
                    task = asyncio.create_task(self._scraped(message, writer))
                    jobs[message.id] = task
                    task.add_done_callback(functools.partial(self._answered, jobs, message.id))
                elif isinstance(message, Call):
                    task = asyncio.create_task(self._called(message, writer))
                    jobs[message.id] = task
                    task.add_done_callback(functools.partial(self._answered, jobs, message.id))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the peer went: its submissions are dropped below
        except ValueError as exc:
            logger.warning("engine host: a peer sent a broken message, its connection is closed: %s", exc)
        finally:
            for source in sources:  # its counters still count; its gauges no longer do
                self.reports[source] = (self.reports[source][0], False)
            for task in jobs.values():
                task.cancel()
            await asyncio.gather(*jobs.values(), return_exceptions=True)
            writer.close()
            self._connections.pop(current, None)

    def serve_engines(self, engines: Mapping[str, BatchEngine[Any]], description: Description) -> None:
        """Serve ``engines`` (the models have loaded) and answer descriptions with ``description``."""
        self.engines = dict(engines)
        self.description = description

    async def _scraped(self, message: Scrape, writer: asyncio.StreamWriter) -> None:
        try:
            own = await asyncio.to_thread(self.exposition)
        except Exception as exc:  # a collector failed: the asker says so
            writer.write(encode(refusal(message.id, exc)))
            return
        others = [(s, text, alive) for s, (text, alive) in self.reports.items() if s != message.except_source]
        writer.write(encode(Scraped(message.id, [("engine", own, True), *others])))
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    async def _called(self, message: Call, writer: asyncio.StreamWriter) -> None:
        """Run ``message``'s call and send back its value or a refusal (unless the connection is gone)."""
        call = self.calls.get(message.name)
        try:
            if call is None:
                raise NotReadyError(f"this engine process does not answer {message.name!r} (yet)")
            with _joined(message.traceparent):
                reply: Returned | Refused = Returned(message.id, await call(message.args))
        except Exception as exc:
            reply = refusal(message.id, exc)
        await _reply(writer, message.id, reply, f"engine call {message.name}", message.request_id)

    def _described(self, job: int) -> Description | Refused:
        if self.description is None:
            return Refused(job, "not_ready", "the engine process is still loading its models")
        return msgspec.structs.replace(self.description, id=job)

    def _answered(self, jobs: dict[int, asyncio.Task[None]], job: int, task: asyncio.Task[None]) -> None:
        jobs.pop(job, None)
        self._jobs.discard(task)

    async def _answer(self, message: Submit, writer: asyncio.StreamWriter) -> None:
        """Compute ``message``'s items and send back what came of it: whatever happens here, the submitter gets
        an answer or a refusal (unless its connection is gone)."""
        try:
            reply = await self._computed(message)
        except Exception as exc:  # what the engine raised (overloaded, invalid, a failed pass) or could not take
            reply = refusal(message.id, exc)
        await _reply(writer, message.id, reply, f"engine {message.engine}", message.request_id)

    async def _computed(self, message: Submit) -> Answer | Refused:
        engine = self.engines.get(message.engine)
        if engine is None:
            return Refused(message.id, "not_ready", f"no engine {message.engine!r} in this process")
        with _joined(message.traceparent):
            waits = tracing.collect_queue_waits()
            out = await engine.submit(message.items, priority=message.priority)
            waited = max(waits) if waits else None
            return Answer(message.id, out.values, list(out.token_counts), list(out.truncated), waited)


@contextlib.contextmanager
def _joined(traceparent: str | None) -> Iterator[None]:
    """Within it, the trace context a message carried is the current one (none carried: unchanged)."""
    token = otel_context.attach(_PROPAGATOR.extract({"traceparent": traceparent})) if traceparent else None
    try:
        yield
    finally:
        if token is not None:
            otel_context.detach(token)


async def _reply(writer: asyncio.StreamWriter, job: int, reply: Message, what: str, request_id: str | None) -> None:
    """``reply`` to question ``job`` written back (a failure logged first, as ``what`` failed; a value that cannot
    cross refused instead), unless the connection is gone."""
    if isinstance(reply, Refused) and reply.kind == "failed":
        logger.warning("%s: request %s failed: %s", what, request_id, reply.message)
    try:
        frame = encode(reply)
    except TypeError as exc:
        frame = encode(refusal(job, exc))
    writer.write(frame)
    with contextlib.suppress(ConnectionError):
        await writer.drain()


# -- the link: a submitting process ------------------------------------------------------------------------------------
class EngineLink:
    """One process's connection to an :class:`EngineHost` at ``path``, shared by every submission of the process,
    opened on first use and again after it was lost."""

    def __init__(
        self, path: str, *, connect_timeout: float = 5.0, request_id: Callable[[], str | None] = lambda: None
    ) -> None:
        self.path = path
        self.connect_timeout = connect_timeout
        self.request_id = request_id  # the current request's id, sent with a submission that names none
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._connecting = asyncio.Lock()

    @property
    def connected(self) -> bool:
        """Whether the connection is open now (it opens on first use, and again after it was lost)."""
        return self._writer is not None and not self._writer.is_closing()

    def engine(self, name: str) -> RemoteEngine:
        """The engine ``name`` of the host, as a ``submit``."""
        return RemoteEngine(self, name)

    async def _connected(self) -> asyncio.StreamWriter:
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_unix_connection(self.path, limit=1 << 20), self.connect_timeout
                )
            except (OSError, TimeoutError) as exc:
                raise NotReadyError(f"the engine process is not reachable ({exc.__class__.__name__}); retry") from None
            self._writer = writer
            self._reading = asyncio.create_task(self._answers(reader, writer))
            return writer

    async def _answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                message = await _read(reader)
                future = self._waiting.pop(getattr(message, "id", -1), None)
                if future is None or future.done():
                    continue
                if isinstance(message, Answer | Description | Scraped | Returned):
                    future.set_result(message)
                elif isinstance(message, Refused):
                    future.set_exception(raised(message))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            if not isinstance(exc, asyncio.IncompleteReadError | ConnectionError):
                logger.warning("engine link: a broken message from the engine process: %s", exc)
        finally:
            writer.close()
            if self._writer is writer:
                self._writer = None
            lost, self._waiting = self._waiting, {}
            for future in lost.values():
                if not future.done():
                    future.set_exception(NotReadyError("the engine process went away while this was computed; retry"))

    async def submit(
        self,
        engine: str,
        items: Sequence[Any],
        *,
        priority: int = 0,
        request_id: str | None = None,
    ) -> ModelOutput:
        """``items`` computed by the host's engine ``engine``, as :meth:`BatchEngine.submit` computes them in
        process; the current trace context travels with them.

        Raises:
            NotReadyError: the engine process cannot be reached, or went away meanwhile.
            OverloadedError, InvalidInputError: as the engine raised them.
            EngineFailedError: the forward pass failed there.
        """
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        request_id = request_id or self.request_id()
        answer: Answer = await self._ask(
            lambda job: Submit(job, engine, priority, list(items), request_id, carrier.get("traceparent"))
        )
        if answer.time_in_queue is not None:
            tracing.note_queue_wait(answer.time_in_queue)  # on the request's span, here
        return ModelOutput(answer.values, answer.token_counts, answer.truncated)

    async def describe(self) -> Description:
        """The host's models and engines (:class:`Description`), once it serves them.

        Raises:
            NotReadyError: the engine process cannot be reached, or is still loading its models.
        """
        described: Description = await self._ask(Describe)
        return described

    async def report(self, source: str, text: bytes, *, ready: bool = True) -> None:
        """Leave this process's figures, and whether it is ready, with the host, under ``source`` (see
        :class:`Report`).

        Raises:
            NotReadyError: the engine process cannot be reached, or went away while it was told.
        """
        await self._send(await self._connected(), Report(source, text, ready))

    async def scrape(self, except_source: str = "") -> list[tuple[str, bytes, bool]]:
        """The host's figures and every other process's last report (:class:`Scraped`).

        Raises:
            NotReadyError: the engine process cannot be reached.
            EngineFailedError: its figures could not be read.
        """
        scraped: Scraped = await self._ask(lambda job: Scrape(job, except_source))
        return scraped.reports

    async def call(self, name: str, args: Any) -> Any:
        """The value of the host process's call ``name`` on ``args`` (:meth:`EngineHost.answer`); the current trace
        context and request id travel with it.

        Raises:
            NotReadyError: the engine process cannot be reached, went away meanwhile, or does not answer ``name``.
            OverloadedError, InvalidInputError: as the call raised them.
            EngineFailedError: the call failed there.
        """
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        request_id = self.request_id()
        returned: Returned = await self._ask(lambda job: Call(job, name, args, request_id, carrier.get("traceparent")))
        return returned.value

    async def _ask(self, question: Callable[[int], Message]) -> Any:
        """The host's answer to ``question(id)`` (raised again if it is a refusal). A caller that stops waiting has
        the question cancelled there (a submission's items leave the queue).

        Raises:
            NotReadyError: the engine process cannot be reached, or went away before it answered.
        """
        writer = await self._connected()
        job = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[job] = future
        try:
            await self._send(writer, question(job))
            return await future
        except asyncio.CancelledError:
            if self._waiting.pop(job, None) is not None and not writer.is_closing():
                writer.write(encode(Cancel(job)))
            raise
        finally:
            self._waiting.pop(job, None)

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, message: Message) -> None:
        """``message`` written to the host.

        Raises:
            NotReadyError: the connection broke.
        """
        writer.write(encode(message))
        try:
            await writer.drain()
        except ConnectionError:
            raise NotReadyError("the engine process went away while this was sent; retry") from None

    async def close(self) -> None:
        """Close the connection; submissions still waiting fail with :class:`NotReadyError`."""
        if self._writer is not None:
            self._writer.close()
        if self._reading is not None:
            await asyncio.gather(self._reading, return_exceptions=True)


class RemoteEngine:
    """One engine of an :class:`EngineHost`, through an :class:`EngineLink`: what a runner holds as its ``engine`` in
    a process that does not hold the model (a service's front). Its batch bounds are the host's (``facts``); its
    queue, its counts and its idleness are the host's engine's, reported by the host's process."""

    def __init__(self, link: EngineLink, name: str, facts: EngineFacts | None = None) -> None:
        self.link = link
        self.name = name
        self.max_batch_tokens = facts.max_batch_tokens if facts is not None else 0
        self.max_batch_size = facts.max_batch_size if facts is not None else 0
        self._waiting = 0  # this process's submissions waiting for an answer
        self._idle = asyncio.Event()
        self._idle.set()

    def start(self) -> None:
        """Nothing to start: the host's engine runs the forward passes."""

    async def submit(self, items: Sequence[Any], *, priority: int = 0, request_id: str | None = None) -> ModelOutput:
        self._waiting += 1
        self._idle.clear()
        try:
            return await self.link.submit(self.name, items, priority=priority, request_id=request_id)
        finally:
            self._waiting -= 1
            if not self._waiting:
                self._idle.set()

    async def drain(self, timeout: float) -> None:
        """Wait until this process's submissions are answered, at most ``timeout`` seconds (the host finishes its
        queue as the engine process drains)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
