"""SIGTERM on the real server process (`litestar run`, weightless fake models): readiness fails at once on
open connections, a stalled body gets 408, the process exits 0 within the drain deadline."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from embedrank.testing.launch import REPO, free_port

KEY = "shutdown-key"
ENV = {
    "EMBEDRANK_MODELS": "fake=fake:encoder",
    "EMBEDRANK_API_KEYS": KEY,
    "EMBEDRANK_DRAIN_SECONDS": "6",
    "EMBEDRANK_BODY_TIMEOUT_SECONDS": "2",
    "EMBEDRANK_TUNE_MALLOC": "0",
}


pytestmark = pytest.mark.slow  # real servers as subprocesses


@pytest.fixture
def server(tmp_path):
    port = free_port()
    litestar = Path(sys.executable).with_name("litestar")
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [str(litestar), "run", "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO,
        env={**os.environ, **ENV},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, (tmp_path / "server.log").read_text()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.1)
    yield proc, port
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    log.close()


def _request(sock: socket.socket, raw: bytes) -> bytes:
    sock.sendall(raw)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


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
    time.sleep(0.3)  # the stalled request is in flight
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    head = _request(probe, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").split(b"\r\n")[0]
    assert b" 503 " in head, head  # readiness fails at once, on a connection that was already open
    stalled.settimeout(10)
    answer = b""
    while chunk := stalled.recv(65536):  # the server closes the connection after the 408
        answer += chunk
    assert b" 408 " in answer.split(b"\r\n")[0] and b"request_timeout" in answer
    assert proc.wait(15) == 0
    assert time.monotonic() - start < 6 + 2  # within the drain deadline
