"""Start the service's container image, wait until it is ready, embed and rerank, stop it; print what it cost.

    python eval/check_image.py --image embedrank:0.2.0 --starts 3

Each start runs ``docker run`` with an API key and a published port, then measures the seconds from the
``docker run`` call to the first ``/health`` answer of 200 (the packaged model is loaded and its export was
made when the image was built), checks that Docker's own health check turns ``healthy``, embeds two texts
and reranks two documents over HTTP, checks that the process runs as a non-root user and that torch is its
CPU build, then stops the container with ``docker stop`` (SIGTERM: the service drains and exits 0) and
measures how long that took. It prints the image size and the median and each start's figures, and exits 1
if any check fails. ``make image-check`` records its output in ``eval/results/container.json``.

``--fronts 0 2`` makes each start once as one process and once as a replica of two front processes and an engine
process (``EMBEDRANK_FRONTS=2``), checking that the container runs that many fronts.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

KEY = "image-check-key"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def docker(*args: str, check: bool = True) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def call(url: str, body: dict | None = None, timeout: float = 30.0) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


FRONTS_RUNNING = (  # the container's processes that are fronts (this one, whose command names them, left out)
    "import os, pathlib; print(sum(b'service.replica.front' in p.read_bytes() for p in pathlib.Path('/proc')"
    ".glob('[0-9]*/cmdline') if p.parent.name != str(os.getpid())))"
)


def start_once(image: str, timeout: float, fronts: int = 0) -> dict:
    port = free_port()
    begun = time.monotonic()
    settings = ["-e", f"EMBEDRANK_API_KEYS={KEY}", "-e", f"EMBEDRANK_FRONTS={fronts}"]
    container = docker("run", "-d", "-p", f"127.0.0.1:{port}:8000", *settings, image)
    base = f"http://127.0.0.1:{port}"
    try:
        ready = None
        while time.monotonic() - begun < timeout:
            try:
                if call(f"{base}/health", timeout=2)[0] == 200:
                    ready = time.monotonic() - begun
                    break
            except (OSError, ValueError):
                pass
            if docker("inspect", "-f", "{{.State.Running}}", container) != "true":
                raise RuntimeError(f"the container exited before it was ready:\n{docker('logs', container)}")
            time.sleep(0.1)
        if ready is None:
            raise RuntimeError(f"not ready after {timeout:.0f} s:\n{docker('logs', container)}")
        status, body = call(f"{base}/v1/embeddings", {"model": MODEL, "input": ["hello world", "good morning"]})
        assert status == 200 and len(body["data"]) == 2 and len(body["data"][0]["embedding"]) == 384, body
        status, body = call(
            f"{base}/v1/rerank", {"model": MODEL, "query": "greeting", "documents": ["hello world", "tax law"]}
        )
        assert status == 200 and body["results"][0]["index"] == 0, body
        assert call(f"{base}/v1/models", None)[0] == 200
        uid = docker("exec", container, "id", "-u")
        assert uid != "0", "the service runs as root"
        cuda = docker("exec", container, "python", "-c", "import torch; print(torch.version.cuda)")
        assert cuda == "None", f"torch in the image is a CUDA build ({cuda})"
        running = int(docker("exec", container, "python", "-c", FRONTS_RUNNING))
        assert running == fronts, f"{running} front processes run in the container, not {fronts}"
        healthy = None
        while time.monotonic() - begun < timeout:  # Docker's HEALTHCHECK runs every 10 s
            healthy = docker("inspect", "-f", "{{.State.Health.Status}}", container)
            if healthy == "healthy":
                break
            time.sleep(0.5)
        assert healthy == "healthy", f"Docker's health check says {healthy}"
        stop_began = time.monotonic()
        docker("stop", "-t", "60", container)
        stopped = time.monotonic() - stop_began
        exit_code = int(docker("inspect", "-f", "{{.State.ExitCode}}", container))
        assert exit_code == 0, f"exit code {exit_code} after SIGTERM:\n{docker('logs', container)}"
        return {"ready_s": ready, "stop_s": stopped, "exit_code": exit_code, "uid": int(uid)}
    finally:
        docker("rm", "-f", container, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--starts", type=int, default=3, help="containers started one after another")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a start may take to be ready")
    parser.add_argument(
        "--fronts", type=int, nargs="+", default=[0], help="each start once with each EMBEDRANK_FRONTS (default 0)"
    )
    args = parser.parse_args(argv)
    size = int(docker("image", "inspect", "-f", "{{.Size}}", args.image))
    base = docker("image", "inspect", "-f", "{{index .Config.Labels \"org.opencontainers.image.base.name\"}}",
                  args.image, check=False)  # fmt: skip
    runs = []
    for number in range(1, args.starts + 1):
        for fronts in args.fronts:
            served = "one process" if fronts == 0 else f"{fronts} fronts and an engine process"
            try:
                run = start_once(args.image, args.timeout, fronts)
            except (AssertionError, RuntimeError) as exc:
                print(f"start {number} ({served}): FAILED: {exc}")
                return 1
            if fronts == args.fronts[0]:
                runs.append(run)
            print(
                f"start {number} ({served}): ready in {run['ready_s']:.1f} s, embedded and reranked, healthy, "
                f"stopped in {run['stop_s']:.1f} s with exit code {run['exit_code']} (uid {run['uid']})"
            )
    print(f"image: {args.image}" + (f" (base {base})" if base and base != "<no value>" else ""))
    print(f"image size: {size / 1e9:.2f} GB ({size / 2**30:.2f} GiB)")
    print(f"time to ready: median {statistics.median(r['ready_s'] for r in runs):.1f} s over {len(runs)} starts")
    print(f"time to stop: median {statistics.median(r['stop_s'] for r in runs):.1f} s (SIGTERM, exit code 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
