"""The service's own ceiling: the HTTP load of the service benchmark on a server whose model's forward pass costs
nothing (``fake:zero-forward``: the packaged MiniLM's real tokenizer, a vector of zeros per text), so that all the
CPU the server uses is the service's own work: HTTP, auth, decoding, limits, tokenizing, batching, encoding the
answer.

For each case (1 query or 16 passages per request, each count of ``--clients`` concurrent keep-alive clients in a
child process, a lean HTTP/1.1 client) it prints texts/s, requests/s, p50 and p99 latency, and the CPU
milliseconds per request of each kind of process of the server (its process tree, by role) and of the load
generator, which shares the machine's cores, and the memory the server's processes hold by role (a replica's
fronts summed). Beside it, the same zero-cost runtime behind the batching engine in
this process with as many callers (tokenizing, batching, no HTTP, no web app), measured right before and after
each case: how much of the engine's own ceiling the server delivers.

``--servers`` names the configurations compared, one after the other and again for each of ``--rounds`` (A B A B);
medians over the rounds close the report.
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import embedrank.openmp  # noqa: F401 - before torch, as in the server: it bounds libgomp's idle spinning
from eval.harness.clients import KEY, MODEL
from eval.harness.load import make_texts, run_client, through_engine

# what each compared server runs as: the fronts of `python -m service` (None: `litestar run`, one process)
SERVERS: dict[str, int | None] = {
    "single": None,  # the service as one process: HTTP, tokenizing and the engine share an interpreter
    "fronts-1": 1,  # one front process (HTTP, tokenizing) beside the engine process
    "fronts-2": 2,
    "fronts-3": 3,
}
CASES = (("query", 1), ("passage", 16))
ROLES_HELD = ("server", "engine", "fronts")  # whose memory the table shows (a replica's fronts: all of them)


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[32])
    p.add_argument("--kinds", nargs="+", choices=[kind for kind, _ in CASES], default=[kind for kind, _ in CASES])
    p.add_argument("--seconds-per-case", type=float, default=8.0, help="about how long each case's load lasts")
    p.add_argument("--servers", nargs="+", choices=sorted(SERVERS), default=["single"])
    p.add_argument("--rounds", type=int, default=2, help="repeat the sequence of servers (A B A B)")
    args = p.parse_args(argv)

    from embedrank.testing.launch import running_server
    from embedrank.testing.zero_forward import zero_forward_encoder

    queries = make_texts(2048, 8, seed=1)  # ~14 tokens with [CLS]/[SEP] and the number
    passages = make_texts(1024, 145, seed=2)  # ~200 tokens
    texts_of = {"query": queries, "passage": passages}
    runtime = zero_forward_encoder(MODEL)
    print(
        "model: fake:zero-forward (the packaged MiniLM's tokenizer, zero vectors: the forward pass costs nothing); "
        f"{os.cpu_count()} CPUs; engine alone: the same runtime behind the batching engine in this process, as many "
        "callers as clients, right before and after each case"
    )
    rows: list[dict] = []
    for round_no in range(1, args.rounds + 1):
        for server in args.servers:
            env = {"EMBEDRANK_API_KEYS": KEY, "EMBEDRANK_MODELS": f"{MODEL}=fake:zero-forward"}
            with running_server(env, timeout=600, fronts=SERVERS[server]) as base:
                for kind, per_request in CASES:
                    if kind not in args.kinds:
                        continue
                    texts = texts_of[kind]
                    for clients in args.clients:
                        before, _ = through_engine(
                            runtime, texts, clients, args.seconds_per_case / 2, per_request=per_request
                        )
                        probe = run_client(base, texts, per_request, clients, clients * 8)
                        requests = max(clients * 8, int(args.seconds_per_case * probe["inputs_s"] / per_request))
                        r = run_client(base, texts, per_request, clients, requests)
                        after, _ = through_engine(
                            runtime, texts, clients, args.seconds_per_case / 2, per_request=per_request
                        )
                        row = _row(server, round_no, kind, per_request, clients, r, (before + after) / 2)
                        rows.append(row)
                        print(_line(row), flush=True)
    report(rows)


def _row(server: str, round_no: int, kind: str, per_request: int, clients: int, r: dict, engine: float) -> dict:
    """One case's figures: rates, latency, CPU ms per request of each role and the load generator."""
    requests_s = r["inputs_s"] / per_request
    cpu = {f"cpu_ms {role}": 1000 * cores / requests_s for role, cores in r["processes"].items() if cores > 0.001}
    rss = {f"rss_mb {role}": held / 2**20 for role, held in r["rss"].items() if role in ROLES_HELD}
    return {
        "server": server,
        "round": round_no,
        "kind": kind,
        "per_request": per_request,
        "clients": clients,
        "texts_s": r["inputs_s"],
        "requests_s": requests_s,
        "p50_ms": r["p50_ms"],
        "p99_ms": r["p99_ms"],
        "mean_batch": r["mean_batch"],
        "cores": r["cores"],
        **cpu,
        "cpu_ms client": 1000 * r["client_cpu"] / requests_s,
        **rss,
        "engine_texts_s": engine,
        "of_engine": r["inputs_s"] / engine,
    }


def _line(row: dict) -> str:
    cpu = ", ".join(f"{k.removeprefix('cpu_ms ')} {v:.2f}" for k, v in row.items() if k.startswith("cpu_ms"))
    rss = ", ".join(f"{k.removeprefix('rss_mb ')} {v:,.0f}" for k, v in row.items() if k.startswith("rss_mb"))
    return (
        f"[{row['server']} round {row['round']}] {row['per_request']:>2} {row['kind']:<7}/req {row['clients']:>3} clients: "
        f"{row['texts_s']:8.1f} texts/s {row['requests_s']:7.1f} requests/s  p50 {row['p50_ms']:6.1f} ms  "
        f"p99 {row['p99_ms']:6.1f} ms | batch {row['mean_batch']:5.1f} | server {row['cores']:.2f} cores | CPU ms per "
        f"request: {cpu} | MB held: {rss} | engine alone {row['engine_texts_s']:8.1f} texts/s, served {row['of_engine']:.0%} of it"
    )


def report(rows: list[dict]) -> None:
    """Medians over the rounds per server, case and client count, as a table."""
    if not rows:
        return
    keys = sorted({k for row in rows for k in row if k.startswith("cpu_ms")}, key=lambda k: (k == "cpu_ms client", k))
    held = sorted({k for row in rows for k in row if k.startswith("rss_mb")})
    columns = ["texts_s", "requests_s", "p50_ms", "p99_ms", "cores", *keys, *held, "engine_texts_s", "of_engine"]
    print(f"\nmedians over {max(row['round'] for row in rows)} rounds")
    heads = [c.replace("cpu_ms ", "CPU ms/request: ").replace("rss_mb ", "MB held: ") for c in columns]
    print("| server | per request | clients | " + " | ".join(heads) + " |")
    print("|---|---|---|" + "---|" * len(columns))
    for key in dict.fromkeys((row["server"], row["kind"], row["per_request"], row["clients"]) for row in rows):
        same = [row for row in rows if (row["server"], row["kind"], row["per_request"], row["clients"]) == key]
        cells = []
        for column in columns:
            values = [row[column] for row in same if column in row]
            value = statistics.median(values) if values else float("nan")
            cells.append(
                f"{value:.0%}" if column == "of_engine" else f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
            )
        server, kind, per_request, clients = key
        print(f"| {server} | {per_request} {kind} | {clients} | " + " | ".join(cells) + " |")
