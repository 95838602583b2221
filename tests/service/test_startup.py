"""The service as a process on real servers: a start that cannot succeed ends with one line on stderr and
exit code 3; SIGTERM while the models load ends the process at once, leaving no half-written export or
range sample behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest

from embedrank.testing.launch import REPO, free_port, litestar_command, running_server

pytestmark = pytest.mark.slow  # real servers as subprocesses


def _start(env: dict[str, str], port: int, tmp_path: Path) -> subprocess.Popen[str]:
    child = {k: v for k, v in os.environ.items() if k != "EMBEDRANK_LOG_LEVEL"}
    child |= {"HF_HUB_OFFLINE": "1", "EMBEDRANK_BATCH_DIR": str(tmp_path / "batches"), **env}
    return subprocess.Popen(
        litestar_command(port), cwd=REPO, env=child, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _outcome(proc: subprocess.Popen[str]) -> tuple[int, list[str], str]:
    """A server that should not start: its exit code, its stderr lines from the failure on, and all it wrote."""
    out, err = proc.communicate(timeout=120)
    lines = err.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("embedrank: cannot start:")), len(lines))
    return proc.returncode, lines[first:], out + err


# each case: what it sets, and what its one line says
CASES = {
    "missing model": (
        {"EMBEDRANK_MODELS": "someone/not-here"},
        "model 'someone/not-here' not found; tried: local path 'someone/not-here' (does not exist); "
        "Hugging Face cache ",
    ),
    "bad setting": ({"EMBEDRANK_DRAIN_SECONDS": "soon"}, "EMBEDRANK_DRAIN_SECONDS (given 'soon'): expected a number"),
    "unreadable key file": ({"EMBEDRANK_API_KEYS_FILE": "{tmp}/no-such-file"}, "EMBEDRANK_API_KEYS_FILE="),
    "port in use": ({"EMBEDRANK_MODELS": "fake=fake:encoder"}, "cannot listen on 127.0.0.1:"),
    "model fails to load": ({"EMBEDRANK_MODELS": "broken={broken}", "EMBEDRANK_API_KEYS": "k"}, "model 'broken' from "),
}


def test_a_start_that_cannot_succeed_is_one_line_and_exit_code_3(tmp_path, broken_model):
    """Every case at once (each server is its own process), then each one's outcome."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        started = {}
        for case, (env, _) in CASES.items():
            env = {k: v.format(tmp=tmp_path, broken=broken_model) for k, v in env.items()}
            port = taken.getsockname()[1] if case == "port in use" else free_port()
            started[case] = _start(env, port, tmp_path / case.replace(" ", "-"))
        debug = _start({"EMBEDRANK_MODELS": "someone/not-here", "EMBEDRANK_LOG_LEVEL": "debug"}, free_port(), tmp_path)
        outcomes = {case: _outcome(proc) for case, proc in started.items()}
        debug_code, debug_failure, debug_everything = _outcome(debug)
    for case, (code, failure, everything) in outcomes.items():
        says = CASES[case][1]
        assert code == 3, (case, everything[-3000:])
        assert len(failure) == 1 and says in failure[0], (case, everything[-3000:])
        assert "Traceback" not in everything, case
    assert outcomes["missing model"][1][0].endswith("Hugging Face hub (skipped: HF_HUB_OFFLINE is set)")
    # EMBEDRANK_LOG_LEVEL=debug adds the traceback to the same line
    assert debug_code == 3 and debug_failure == outcomes["missing model"][1]
    assert "Traceback" in debug_everything and "ModelNotFoundError" in debug_everything


def _unfinished(cache: Path) -> list[Path]:
    """Temporary files and folders (named ``.<target>-...``) left in the cache, and exports without their
    record."""
    left = list(cache.rglob(".*"))
    exports = cache / "exports"
    if exports.is_dir():
        left += [p for p in exports.iterdir() if p.is_dir() and not (p / "export.json").is_file()]
    return left


def test_sigterm_while_the_models_load_exits_at_once_and_leaves_nothing_half_written(tmp_path):
    """The packaged model with an empty cache: its start exports it and fits its int8/uint8 ranges (seconds).
    SIGTERM at seeded random points of that ends the process with code 0, without waiting for the loading
    thread, and the cache holds only finished exports and samples; a last start uses them."""
    cache = tmp_path / "cache"
    env = {"EMBEDRANK_CACHE": str(cache), "EMBEDRANK_API_KEYS": "k"}
    rng = np.random.default_rng(5)
    for delay in rng.uniform(0.0, 2.5, size=3):
        proc = _start(env, free_port(), tmp_path)
        assert proc.stderr is not None
        for line in proc.stderr:  # the lifespan has started the loading thread
            if "Application startup complete" in line:
                break
        time.sleep(delay)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - started
        assert proc.returncode == 0, err[-3000:]
        assert took < 10, f"{took:.1f} s to exit after SIGTERM during loading"  # ~0.7 s on a quiet 2-core machine
        assert not _unfinished(cache), _unfinished(cache)
    with running_server(env) as base:
        assert base  # what the interrupted starts left is used or made again, and the service becomes ready
    assert not _unfinished(cache)


@pytest.mark.kernel_free
def test_serve_others_serves_the_models_that_loaded_and_says_which_did_not(broken_model):
    """``on_model_failure = "serve-others"``: the broken model is left out, /health is 200 and names it, a
    request for it (by id or alias) is a 503 with the reason, and the other model serves."""
    from litestar.testing import TestClient

    from service.app import create_app
    from service.settings import Auth, Engine, ModelEntry, Models, Settings

    entries = (
        ModelEntry(id="fine", path="fake:encoder"),
        ModelEntry(id="broken", path=broken_model, aliases=("also-broken",)),
    )
    settings = Settings(
        models=Models(entries=entries, on_model_failure="serve-others"),
        auth=Auth(api_keys=("k",)),
        engine=Engine(tune_malloc=False),
    )
    auth = {"Authorization": "Bearer k"}
    with TestClient(create_app(settings, wait_for_models=True)) as client:
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert health.json()["detail"].startswith("serving 1 of 2 models; model 'broken' from ")
        assert [m["id"] for m in client.get("/v1/models", headers=auth).json()["data"]] == ["fine"]
        for name in ("broken", "also-broken"):
            refused = client.post("/v1/embeddings", json={"model": name, "input": "x"}, headers=auth)
            assert refused.status_code == 503 and "could not be loaded" in refused.json()["error"]["message"]
            assert refused.json()["error"]["code"] == "model_unavailable" and "retry-after" not in refused.headers
        assert client.post("/v1/embeddings", json={"model": "fine", "input": "x"}, headers=auth).status_code == 200
    alone = msgspec.structs.replace(settings, models=Models(entries=entries[1:], on_model_failure="serve-others"))
    with TestClient(create_app(alone, wait_for_models=True)) as client:  # nothing to serve: it fails
        assert client.get("/health").status_code == 503 and client.get("/health").json()["status"] == "failed"
