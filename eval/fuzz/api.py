#!/usr/bin/env python
"""Fuzz the service over its own OpenAPI schema with schemathesis, every check on.

Starts ``litestar run`` on a free loopback port (by default with the weightless fake models, one embedding
model with e5-style query/passage prompts and one cross-encoder, so that thousands of cases take seconds; ``--real`` serves the packaged
MiniLM instead) and runs ``schemathesis run --checks all`` against ``/openapi.json``: the examples,
coverage (boundary values of every field) and fuzzing phases, positive and negative data, with a key.

The schema names the served models (``model`` is an ``enum`` of the ids and aliases of ``/v1/models``), so
generated requests reach the models instead of stopping at 404. ``eval/fuzz/hooks.py`` counts the cases
each operation got, and exempts one rejection from ``positive_data_acceptance``: a text over the model's
token limit sent with ``"truncate": false`` is a 400, which JSON Schema cannot express (see that file).
``eval/fuzz/schemathesis.toml`` adds 413 (body over ``EMBEDRANK_MAX_BODY_BYTES``) to the accepted statuses.

Then, on the same server, the edge cases JSON Schema cannot make schemathesis send (``eval/fuzz/edges.py``):
numbers out of a 64-bit float's range in every integer field, in unknown fields and as inputs, and every
integer field (the chunking ones included, with texts long enough to chunk) at and past its bounds.

Goal: 0 failures of any kind, with at least 1,000 generated cases per POST endpoint.

    python -m eval.fuzz.api                 # 1,000 fuzzing cases per operation (make fuzz)
    python -m eval.fuzz.api --cases 100     # the short version the test suite runs
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from embedrank.testing.launch import running_server  # noqa: E402

KEY = "fuzz-key"
FAKE_MODELS = "fake-embedder=fake:encoder-with-prompts,fake-reranker=fake:cross-encoder,fake-sparse=fake:sparse"


def per_operation(counts: dict[str, int]) -> dict[str, collections.Counter[str]]:
    """``{"POST /v1/rerank": Counter({"fuzzing/positive": 700, ...})}`` from the hooks' counts."""
    out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for key, n in counts.items():
        operation, phase, mode = key.split("|")
        out[operation][f"{phase}/{mode}"] += n
    return out


def run(cases: int, seed: int, workers: int, real: bool, log_path: str | None = None) -> tuple[int, dict]:
    """Run the fuzzer against a fresh server; returns schemathesis' exit code and its JSON report plus the
    per-operation counts (``report["per_operation"]``)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            "EMBEDRANK_API_KEYS": KEY,
            "EMBEDRANK_IDLE_SECONDS": "5",
            "EMBEDRANK_BATCH_DIR": str(Path(tmp, "batches")),
        }
        if not real:
            env["EMBEDRANK_MODELS"] = FAKE_MODELS
        return _run(env, tmp, cases, seed, workers, log_path)


def _run(env: dict[str, str], tmp: str, cases: int, seed: int, workers: int, log_path: str | None) -> tuple[int, dict]:
    with running_server(env, log_path=log_path) as base:
        report, counts = Path(tmp, "report.json"), Path(tmp, "counts.json")
        schemathesis = Path(sys.executable).with_name("schemathesis")
        cmd = [
            str(schemathesis),
            "--config-file",
            str(HERE / "schemathesis.toml"),
            "run",
            f"{base}/openapi.json",
            "--checks",
            "all",
            "--max-examples",
            str(cases),
            "--seed",
            str(seed),
            "--workers",
            str(workers),
            "--header",
            f"Authorization: Bearer {KEY}",
            "--generation-database",
            "none",
            "--no-color",
            "--continue-on-failure",  # the exempt rejection must not end an operation's fuzzing early
            "--report",
            "json",
            "--report-json-path",
            str(report),
        ]
        child_env = {
            **os.environ,
            "SCHEMATHESIS_HOOKS": "eval.fuzz.hooks",  # found from the repository's root
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "EMBEDRANK_FUZZ_COUNTS": str(counts),
        }
        proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True)
        if proc.returncode != 0:  # the failures, with request bodies cut to a readable length
            print("\n".join(line[:2000] for line in proc.stdout.splitlines()), proc.stderr[-5000:], file=sys.stderr)
        result = json.loads(report.read_text()) if report.is_file() else {}
        result["per_operation"] = per_operation(json.loads(counts.read_text())) if counts.is_file() else {}
        result["stdout_tail"] = proc.stdout[-3000:]
        result["edges"] = run_edges(base)
        for message in result["edges"]["failures"][:20]:
            print(message, file=sys.stderr)
        return proc.returncode or int(bool(result["edges"]["failures"])), result


def run_edges(base: str) -> dict:
    """Send every case of :func:`fuzz_edges.edges` to the server at ``base``; ``{"cases", "failures", "by_status"}``."""
    import httpx

    from eval.fuzz import edges as fuzz_edges

    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
        schema = client.get("/openapi.json").raise_for_status().json()
        models = [m["id"] for m in client.get("/v1/models").raise_for_status().json()["data"]]
        bases = fuzz_edges.bases(schema, models, lambda path, body: client.post(path, content=body).status_code)
        cases = fuzz_edges.edges(schema, bases)
        failures, statuses = [], collections.Counter()
        for edge in cases:
            response = client.post(edge.path, content=edge.body)
            statuses[response.status_code] += 1
            why = fuzz_edges.failure(edge, response.status_code, response.text)
            if why is not None:
                failures.append(f"POST {edge.path} {edge.body[:160]!r}: {why}")
    return {
        "cases": len(cases),
        "operations": sorted(bases),
        "failures": failures,
        "by_status": dict(sorted(statuses.items())),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=1000, help="fuzzing cases per operation (default 1000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="schemathesis workers (default 1; with 2, one POST operation's fuzzing stopped early)",
    )
    p.add_argument("--real", action="store_true", help="serve the packaged MiniLM instead of the fake models")
    args = p.parse_args(argv)
    code, result = run(args.cases, args.seed, args.workers, args.real)
    print(f"schemathesis {result.get('schemathesis_version')}, --checks all, seed {args.seed}, exit {code}")
    for operation, phases in sorted(result["per_operation"].items()):
        detail = ", ".join(f"{k} {v}" for k, v in sorted(phases.items()))
        print(f"  {operation:22s} {sum(phases.values()):6d} requests ({detail})")
    cases = result.get("test_cases", {})
    print(
        f"generated {cases.get('generated')} cases, {cases.get('with_failures')} with failures, "
        f"{len(result.get('failures', []))} failures, {len(result.get('errors', []))} errors"
    )
    edges = result["edges"]
    print(
        f"edge cases (out-of-range numbers, bounds, chunking): {edges['cases']} over {len(edges['operations'])} "
        f"operations, statuses {edges['by_status']}, {len(edges['failures'])} failures"
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
