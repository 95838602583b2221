"""SIGTERM on the real server process (`litestar run`, weightless fake models): readiness fails at once on
open connections, a stalled body gets 408, the process exits 0 within the drain deadline."""

from __future__ import annotations

import signal
import socket
import threading
import time

import httpx
import pytest

from embedrank.testing.launch import running_server

KEY = "shutdown-key"
ENV = {
    "EMBEDRANK_MODELS": "fake=fake:encoder",
    "EMBEDRANK_API_KEYS": KEY,
    "EMBEDRANK_DRAIN_SECONDS": "6",
    "EMBEDRANK_BODY_TIMEOUT_SECONDS": "2",
    "EMBEDRANK_TUNE_MALLOC": "0",
}


pytestmark = [pytest.mark.slow, pytest.mark.kernel_free]  # real servers as subprocesses


@pytest.fixture
def server(tmp_path):
    with running_server(ENV, log_path=str(tmp_path / "server.log")) as base:
        yield base.process, int(base.rsplit(":", 1)[1])


def _in_progress(port: int) -> float:
    """Requests the server is serving, this /metrics request included."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    return float(
        next(line.split()[-1] for line in text.splitlines() if line.startswith("embedrank_requests_in_progress "))
    )


def _wait_for(condition, what: str, timeout: float = 10.0) -> None:
    """Poll ``condition`` (a readiness probe, not a sleep that hopes the server is there yet)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _request(sock: socket.socket, raw: bytes) -> bytes:
    """Send ``raw`` and read one whole response (headers, then Content-Length bytes of body): the header
    block is returned, and the connection is left at the start of the next response."""
    sock.sendall(raw)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(v)
            for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
            if k.strip().lower() == b"content-length"
        ),
        0,
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head


def test_sigterm_on_an_idle_server_exits_0(server):
    proc, _ = server
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0


def test_sigterm_drains_health_503_stalled_body_408_exit_0(server):
    proc, port = server
    stalled = socket.create_connection(("127.0.0.1", port))
    stalled.sendall(
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 1000\r\n\r\n" + b'{"model": "fake"'
    )
    probe = socket.create_connection(("127.0.0.1", port))
    assert b" 200 " in _request(probe, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").split(b"\r\n")[0]
    _wait_for(lambda: _in_progress(port) >= 2, "the stalled request to be in progress")  # it, and the probe
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    heads: list[bytes] = []

    def unready() -> bool:  # readiness fails at once, on a connection that was already open
        heads.append(_request(probe, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").split(b"\r\n")[0])
        return b" 503 " in heads[-1]

    _wait_for(unready, "/health to answer 503 after SIGTERM", timeout=5)
    stalled.settimeout(10)
    answer = b""
    while chunk := stalled.recv(65536):  # the server closes the connection after the 408
        answer += chunk
    assert b" 408 " in answer.split(b"\r\n")[0] and b"request_timeout" in answer
    assert proc.wait(15) == 0
    assert time.monotonic() - start < 6 + 10  # within the drain deadline (10 s for a busy machine to exit)


def test_the_drain_deadline_bounds_a_half_sent_body(tmp_path):
    """A body that would take longer than the drain (body timeout 30 s, drain 3 s) does not hold the process:
    it exits within the drain deadline, whatever its connections are waiting for."""
    env = {**ENV, "EMBEDRANK_DRAIN_SECONDS": "3", "EMBEDRANK_BODY_TIMEOUT_SECONDS": "30"}
    with running_server(env, log_path=str(tmp_path / "server.log")) as base:
        proc, port = base.process, int(base.rsplit(":", 1)[1])
        stalled = socket.create_connection(("127.0.0.1", port))
        stalled.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 1000\r\n\r\n" + b'{"model": "fake"'
        )
        _wait_for(lambda: _in_progress(port) >= 2, "the stalled request to be in progress")
        stop = threading.Event()

        def trickle() -> None:  # one byte a second: the body keeps arriving, never completes
            while not stop.wait(1.0):
                try:
                    stalled.sendall(b" ")
                except OSError:
                    return

        sender = threading.Thread(target=trickle, daemon=True)
        sender.start()
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        took = time.monotonic() - start
        stop.set()
        stalled.close()
    assert code == 0 and took < 3 + 10, took  # the drain, not the body's 30 s (10 s for a busy machine to exit)
