"""An OTLP/HTTP sink for the benchmarks that measure tracing's cost."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def otlp_sink() -> Iterator[tuple[str, dict[str, int]]]:
    """An OTLP/HTTP endpoint that accepts every export and keeps only its count and size (a collector that
    costs this machine next to nothing); yields its base URL and the counts."""
    import http.server
    import threading

    received = {"exports": 0, "bytes": 0}

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            received["exports"] += 1
            received["bytes"] += len(body)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
