"""Request headers have a deadline: slowloris and never-used connections get 408 and are closed."""

from __future__ import annotations

import json
import socket
import time

import pytest

from embedrank.testing.launch import running_server
from service.connections import HeaderDeadline, json_parse_errors

pytestmark = pytest.mark.kernel_free


class Transport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


class Cycle:
    def __init__(self, response_complete: bool) -> None:
        self.response_complete = response_complete


class Protocol:
    """The attributes of a uvicorn HTTP protocol that the deadline reads."""

    def __init__(self, cycle: Cycle | None = None, keep_alive_timer: object | None = None) -> None:
        self.cycle = cycle
        self.timeout_keep_alive_task = keep_alive_timer
        self.transport = Transport()


class Server:
    def __init__(self, *protocols: Protocol) -> None:
        self.server_state = type("State", (), {"connections": set(protocols)})()


def test_only_connections_waiting_for_headers_past_the_deadline_are_closed():
    new = Protocol()  # connected, no complete request headers yet
    busy = Protocol(Cycle(response_complete=False))  # headers arrived, request in progress
    kept_alive = Protocol(Cycle(response_complete=True), keep_alive_timer=object())  # uvicorn's own timer
    next_request = Protocol(Cycle(response_complete=True))  # started sending a second request
    deadline = HeaderDeadline(Server(new, busy, kept_alive, next_request), timeout=2.0)
    deadline.sweep(0.0)
    deadline.sweep(2.0)
    assert deadline.closed == 0
    next_request.cycle = Cycle(response_complete=False)  # its headers completed in time: clock reset
    deadline.sweep(2.5)
    assert (new.transport.closed, busy.transport.closed, kept_alive.transport.closed) == (True, False, False)
    assert not next_request.transport.closed and deadline.closed == 1
    assert new.transport.written.startswith(b"HTTP/1.1 408 ") and b'"code": "request_timeout"' in new.transport.written


def _read_until_closed(sock: socket.socket, trickle: bytes, seconds: float) -> tuple[bytes, float]:
    """Send ``trickle`` one byte at a time (a slowloris client) and read until the server closes."""
    sock.settimeout(0.2)
    start, got = time.monotonic(), b""
    position = 0
    while time.monotonic() - start < seconds:
        if position < len(trickle):
            try:
                sock.sendall(trickle[position : position + 1])
            except OSError:
                break
            position += 1
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    return got, time.monotonic() - start


@pytest.mark.slow  # starts a real server
@pytest.mark.parametrize("trickle", [b"", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000])
def test_the_real_server_closes_slow_header_connections(tmp_path, trickle):
    env = {
        "EMBEDRANK_MODELS": "fake=fake:encoder",
        "EMBEDRANK_API_KEYS": "k",
        "EMBEDRANK_HEADER_TIMEOUT_SECONDS": "1",
    }
    with running_server(env, log_path=str(tmp_path / "server.log")) as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            got, seconds = _read_until_closed(sock, trickle, seconds=30)
        assert got.startswith(b"HTTP/1.1 408 "), got[:200]
        assert seconds < 30  # closed by the deadline (1 s, checked every second), not by the test


class PlainProtocol:
    def __init__(self) -> None:
        self.transport = Transport()

    def send_400_response(self, msg: str) -> None:  # what uvicorn's protocols do
        self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\n\r\n" + msg.encode())
        self.transport.close()


def test_parse_errors_get_the_error_shape_from_the_servers_protocol_class():
    server = type("Server", (), {"config": type("Config", (), {"http_protocol_class": PlainProtocol})()})()
    json_parse_errors(server)
    json_parse_errors(server)  # idempotent: one subclass
    cls = server.config.http_protocol_class
    assert issubclass(cls, PlainProtocol) and cls.__mro__[1] is PlainProtocol
    protocol = cls()
    protocol.send_400_response("Invalid HTTP request received.")
    head, _, body = protocol.transport.written.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"content-type: application/json" in head
    assert int(head.split(b"content-length: ")[1].split(b"\r\n")[0]) == len(body)
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_http" and "invalid http request received" in error["message"]
    assert protocol.transport.closed


MALFORMED = {
    "garbage request line": b"\x00\x01\x02 nonsense\r\n\r\n",
    "bad HTTP version": b"GET /health HTTP/9.x\r\nHost: x\r\n\r\n",
    "space in header name": b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n",
    "Content-Length not a number": b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    "negative Content-Length": b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    "two framings": (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ),
    "bad chunk size": b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
    "control character in header value": b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",
}


@pytest.mark.slow  # starts a real server
def test_the_real_server_answers_unparsable_requests_in_the_error_shape(tmp_path):
    env = {"EMBEDRANK_MODELS": "fake=fake:encoder", "EMBEDRANK_API_KEYS": "k"}
    answers = {}
    with running_server(env, log_path=str(tmp_path / "server.log")) as base:
        host, port = base.removeprefix("http://").split(":")
        for name, raw in MALFORMED.items():
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(raw)
                got = b""
                while chunk := sock.recv(4096):
                    got += chunk
            answers[name] = got
    for name, got in answers.items():
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 "), (name, got[:300])
        assert b"content-type: application/json" in head.lower() and b"\r\ndate: " in head.lower(), (name, head)
        assert json.loads(body)["error"]["code"] == "invalid_http", (name, body)
