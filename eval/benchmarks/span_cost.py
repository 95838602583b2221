#!/usr/bin/env python
"""What tracing costs a one-query request in CPU, with the service's own tracing code and OpenTelemetry's SDK:
the server middleware (:class:`service.tracing.ServerSpans`), the core's GenAI and queue-wait attributes and
one forward span per 16 requests (:mod:`embedrank.serving.tracing`), every span sampled and exported by the
SDK's batch processor and OTLP/HTTP exporter to a sink in another process; against the same requests with
tracing off. The requests do no other work (no model, no HTTP parsing): what is measured is tracing alone.

Printed: CPU microseconds per request (this process, all threads: the event loop's share and the exporter
thread's), per span, and what that is of the CPU a one-query request of the served default costs in the
``tracing`` record's untraced rounds (its server's cores divided by its requests per second). The requests
follow each other with nothing between them, so caches stay warm: this is the least tracing costs, and the
throughput it leaves a traced server whose cores are all busy is at most the one printed.

    python -m eval bench span-cost
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import statistics
import sys
import time
from pathlib import Path

BATCH = 16  # requests per forward pass: the served default's mean batch at 32 one-query clients (tracing record)


def _sink(port: multiprocessing.connection.Connection) -> None:
    from eval.harness.otlp import otlp_sink

    with otlp_sink() as (endpoint, _):
        port.send(endpoint)
        port.recv()  # until told to stop


def request_cpu_ms(record: Path) -> float | None:
    """The CPU ms one one-query request cost the untraced served default in ``record`` (median over rounds)."""
    if not record.is_file():
        return None
    found = re.findall(
        r"^\[default round \d+\]\s+1 query\s+/req\s+32 clients:\s+(\S+) inputs/s.*?server (\S+)",
        json.loads(record.read_text())["output"],
        flags=re.M,
    )
    return statistics.median(float(cores) / float(rate) * 1000 for rate, cores in found) if found else None


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=10_000, help="requests per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds, traced and untraced alternated")
    args = p.parse_args(argv)

    parent, child = multiprocessing.Pipe()
    sink = multiprocessing.Process(target=_sink, args=(child,), daemon=True)
    sink.start()
    endpoint = parent.recv()
    os.environ.update(
        {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_TRACES_SAMPLER": "always_on",
            # these requests come far faster than a server's: a queue that holds them all drops no span
            "OTEL_BSP_MAX_QUEUE_SIZE": str(4 * args.requests),
        }
    )

    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

    from embedrank.runtime.cpus import cpu_identity
    from embedrank.serving import tracing
    from service import tracing as service_tracing

    provider = service_tracing.provider_from_env(os.environ)
    assert provider is not None

    class Count(SpanProcessor):
        spans = 0

        def on_end(self, span: ReadableSpan) -> None:
            Count.spans += 1

    provider.add_span_processor(Count())
    waiting: list[tracing.Queued] = []

    async def app(scope: dict, receive: object, send: object) -> None:
        """What the service's tracing does for one one-query request, with no other work."""
        tracing.note_model("all-minilm-l6-v2")
        tracing.note_operation("embeddings")
        queued = tracing.queued()
        if queued is not None:
            queued.began_ns = time.time_ns()
            waiting.append(queued)
            if len(waiting) == BATCH:
                attributes = {
                    "embedrank.batch.items": BATCH,
                    "embedrank.batch.padded_tokens": 224,
                    "embedrank.batch.tokens": 224,
                }
                tracing.forward(waiting, attributes, waiting[0].began_ns, time.time_ns(), None)
                waiting.clear()
        tracing.note_usage(14)
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"{}"})  # type: ignore[operator]

    async def send(message: dict) -> None:
        pass

    def scope() -> dict:
        return {
            "type": "http",
            "method": "POST",
            "path": "/v1/embeddings",
            "scheme": "http",
            "headers": [],
            "state": {},
        }

    traced_app = service_tracing.traced(app, provider, route_of=lambda path: path)

    async def run(served: object) -> float:
        """The event loop's CPU is counted until the last request, the process's until every span is exported."""
        started, loop_started = time.process_time(), time.thread_time()
        for _ in range(args.requests):
            await served(scope(), None, send)  # type: ignore[operator]
        loop[served is traced_app].append((time.thread_time() - loop_started) / args.requests * 1e6)
        provider.force_flush()
        return (time.process_time() - started) / args.requests * 1e6

    per_request: dict[str, list[float]] = {"off": [], "traced": []}
    loop: dict[bool, list[float]] = {False: [], True: []}  # the event loop's thread alone, untraced and traced
    spans_per_request = []
    for _ in range(args.rounds):
        tracing.use(None)
        per_request["off"].append(asyncio.run(run(app)))
        tracing.use(provider)
        before = Count.spans
        per_request["traced"].append(asyncio.run(run(traced_app)))
        spans_per_request.append((Count.spans - before) / args.requests)
    provider.shutdown()
    parent.send("stop")
    sink.join(timeout=10)

    off, on = statistics.median(per_request["off"]), statistics.median(per_request["traced"])
    spans = statistics.median(spans_per_request)
    cost = on - off
    cpu, _ = cpu_identity()
    print(f"{args.rounds} rounds of {args.requests:,} requests, traced and untraced alternated, on {cpu}")
    print(
        f"CPU per request: untraced {off:.1f} us, traced {on:.1f} us (rounds: "
        + ", ".join(f"{x:.1f}" for x in per_request["traced"])
        + ")"
    )
    on_loop = statistics.median(loop[True]) - statistics.median(loop[False])
    print(
        f"tracing's cost: {cost:.1f} us per request ({on_loop:.1f} us on the event loop: recording the spans; the rest "
        f"in the exporter's thread: encoding and sending them), {spans:.3f} spans per request, {cost / spans:.1f} us "
        "per span"
    )
    from eval.harness.record import RESULTS

    record = RESULTS / "tracing.json"
    request = request_cpu_ms(record)
    if request is not None:
        share = cost / 1000 / request
        print(
            f"a one-query request of the served default costs {request:.2f} ms of CPU (record tracing, untraced "
            f"rounds): tracing adds {share:.1%}, so a server whose cores are all busy keeps at most "
            f"{1 / (1 + share):.1%} of its throughput"
        )


if __name__ == "__main__":
    sys.exit(run())
