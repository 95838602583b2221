"""The quick starts of the README and the getting-started page, run verbatim: each shell block is written to a
script as it stands in the page and run by bash in a fresh, empty directory, with the installed environment
on PATH (as after ``. .venv/bin/activate``) and nothing else from the test's environment. The blocks of
``make`` targets are what CI itself runs (``.ci/run``: ``make test``)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "docs" / "getting-started.md"]


def shell_blocks(page: Path) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.S | re.M)


def is_make(block: str) -> bool:
    return all(line.startswith("make ") for line in block.splitlines() if line.strip())


def is_install(block: str) -> bool:
    return block.startswith("python3 -m venv")


QUICK_STARTS = [
    (page, block) for page in PAGES for block in shell_blocks(page) if not is_make(block) and not is_install(block)
]


def fresh_shell_env(home: Path) -> dict[str, str]:
    """What a new login shell with the environment activated has: no EMBEDRANK_ or HF_ variable. The export
    cache is the suite's own (``EMBEDRANK_CACHE``), so the test does not write into the user's cache."""
    venv_bin = str(Path(sys.executable).parent)
    return {
        "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
        "VIRTUAL_ENV": str(Path(venv_bin).parent),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "EMBEDRANK_CACHE": os.environ["EMBEDRANK_CACHE"],
    }


def run_verbatim(block: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    script = cwd.parent / f"{cwd.name}.sh"
    script.write_text("set -euo pipefail\n" + block)
    log = cwd.parent / f"{cwd.name}.log"  # a file, not a pipe: a server left in the background keeps it open
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["bash", str(script)], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        proc.wait(timeout=timeout)
    finally:  # whatever the block left running in the background (the server), in its own process group
        stop_group(proc.pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, log.read_text())


def stop_group(pgid: int, grace: float = 40.0) -> None:
    """SIGTERM to the process group (the service drains, then exits), SIGKILL after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_the_pages_have_quick_starts():
    assert {page.name for page, _ in QUICK_STARTS} == {"README.md", "getting-started.md"}
    assert any(is_install(block) for page in PAGES for block in shell_blocks(page))


@pytest.mark.parametrize(
    ("page", "block"), QUICK_STARTS, ids=[f"{p.name}-{i}" for i, (p, _) in enumerate(QUICK_STARTS)]
)
def test_a_quick_start_pasted_into_a_fresh_shell_succeeds(page, block, tmp_path):
    assert port_free(8000), "something already listens on localhost:8000, which the quick starts use"
    workdir = tmp_path / "fresh"
    workdir.mkdir()
    done = run_verbatim(block, workdir, fresh_shell_env(tmp_path / "home"), timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    assert '"status":"ok"' in done.stdout, done.stdout[-4000:]
    assert '"object":"embedding"' in done.stdout or '"embedding"' in done.stdout, done.stdout[-4000:]
    if "/v1/rerank" in block:
        assert '"relevance_score"' in done.stdout, done.stdout[-4000:]
    assert list(workdir.iterdir()) == [], "a quick start writes nothing into the directory it runs in"


@pytest.mark.extended  # a whole install (90 s on 2 cores); the make path is what every run of make test installs
def test_the_install_without_make_works_in_a_fresh_clone(tmp_path):
    """The getting-started page's pip commands, verbatim, in a fresh clone of this checkout's commit."""
    (block,) = [block for page in PAGES for block in shell_blocks(page) if is_install(block)]
    clone = tmp_path / "checkout"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    env = fresh_shell_env(Path.home())  # pip's own cache, as a user's second install would have
    base_python = Path(getattr(sys, "_base_executable", sys.executable)).resolve().parent
    env["PATH"] = f"{base_python}:/usr/local/bin:/usr/bin:/bin"  # until the block makes and activates its .venv
    env.pop("VIRTUAL_ENV")
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})  # this machine's pip settings
    done = run_verbatim(block + "\npython -c 'import embedrank, openvino, onnxruntime, nncf, torch; "
                        "print(embedrank.__version__, torch.__version__)'\n", clone, env, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:]
    assert "+cpu" in done.stdout.splitlines()[-1], done.stdout[-2000:]
