"""A replica's front process: ``python -m service.replica.front --fd N`` (started by
:mod:`service.replica.supervisor`, with ``EMBEDRANK_ENGINE_SOCKET`` set and the listening socket as file descriptor
``N``): uvicorn serving :func:`service.app.create_app` on that socket, in front mode.

Every front accepts on the same socket: the kernel hands each new connection to one of them. SIGTERM drains as a
one-process server does (new requests 503, those in flight finish within ``drain_seconds``), exit 0.
"""

from __future__ import annotations

import argparse
import socket
import sys

import uvicorn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.replica.front", description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="the listening socket, inherited")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    config = uvicorn.Config("service.app:create_app", factory=True, fd=args.fd, log_level=args.log_level)
    server = uvicorn.Server(config)
    # the socket as what it is (TCP): uvicorn's own --fd takes every inherited socket for a Unix one, and asyncio
    # then leaves Nagle's algorithm on for its connections (40 ms more for every small answer)
    server.run(sockets=[socket.socket(fileno=args.fd)])
    return 0 if server.started else 3


if __name__ == "__main__":
    sys.exit(main())
