"""``python -m service``: serve the API on ``--host``/``--port`` as the settings say.

With ``fronts = N`` (``EMBEDRANK_FRONTS``, or ``--fronts``) above 0, as a replica of processes
(:mod:`service.replica`): N HTTP front processes sharing the port and one engine process that runs every model's
forward passes; with 0 (the default), in one process, as ``litestar run`` serves.
"""

from __future__ import annotations

import argparse
import os
import sys

from service import process
from service.settings import MAX_FRONTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="the port to listen on (default 8000)")
    parser.add_argument("--fronts", type=int, help="front processes (default: the `fronts` setting, 0 = one process)")
    args = parser.parse_args(argv)
    settings = process.settings_or_exit()
    fronts = settings.server.fronts if args.fronts is None else args.fronts
    if not 0 <= fronts <= MAX_FRONTS:
        process.fail_to_start(ValueError(f"--fronts must be 0 to {MAX_FRONTS}, got {fronts}"))
    level = settings.telemetry.log_level
    if fronts == 0:
        import uvicorn

        uvicorn.run("service.app:create_app", factory=True, host=args.host, port=args.port, log_level=level)
        return 0
    # the replica's own process needs none of what the settings imported (torch, the models' code): a lean one
    supervisor = [sys.executable, "-m", "service.replica.supervisor", "--host", args.host, "--port", str(args.port)]
    supervisor += ["--fronts", str(fronts), "--drain-seconds", str(settings.server.drain_seconds)]
    os.execv(sys.executable, [*supervisor, "--log-level", level])


if __name__ == "__main__":
    sys.exit(main())
