"""Request headers have a deadline: slowloris and never-used connections get 408 and are closed."""

from __future__ import annotations

import socket
import time

import pytest

from embedrank.testing.launch import running_server
from service.connections import HeaderDeadline


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
