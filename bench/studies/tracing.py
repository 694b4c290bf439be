"""What tracing costs, off and on, in the same run (docs/operations.md, "Traces"):

1. drain: N pre-enqueued 3-row imports through one `importer worker` (2 threads):
   imports/s with OTEL_TRACES_EXPORTER unset, and with it `otlp` (every span
   exported over OTLP/HTTP to a sink this study runs, which answers 200 at once);
2. HTTP: wrk POSTing unique 3-row batches to `importer serve` with a worker
   draining: req/s and p99, off and on;
3. in process: the hooks' cost per POST when off (a span and a traceparent asked
   for, as the enqueue step does), against an empty loop.

Rounds alternate off/on, each with its own valkey; medians are reported.

    python -m bench.studies.tracing --imports 20000 --rounds 3 --seconds 10
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.suite.ledger import http_round, one_round


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that reads each export and answers 200 (an empty response message)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def hooks_off_ns(n: int = 1_000_000) -> float:
    """ns per POST spent in the tracing hooks when off (span + traceparent), minus an empty loop's."""
    from opentelemetry.trace import SpanKind

    from importer.adapters import tracing

    assert not tracing.on()
    attributes = {"db.system.name": "redis", "importer.job_id": "shipment-x"}
    t0 = time.perf_counter_ns()
    for _ in range(n):
        with tracing.span("enqueue.lua", SpanKind.CLIENT, attributes=attributes):
            tracing.traceparent()
    hooks = time.perf_counter_ns() - t0
    t0 = time.perf_counter_ns()
    for _ in range(n):
        pass
    empty = time.perf_counter_ns() - t0
    return (hooks - empty) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--imports", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    traced = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink.server_address[1]}"}
    base = Path(tempfile.mkdtemp(prefix="importer-bench-tracing-"))

    drain: dict[bool, list[float]] = {False: [], True: []}
    http: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for r in range(args.rounds):
        for on in (False, True):
            env = traced if on else {}
            res = one_round(args.imports, False, base / f"d{r}-{on}", env)
            drain[on].append(res["imports_per_s"])
            got = http_round(False, base / f"h{r}-{on}", args.seconds, env)
            if got is not None:
                http[on].append(got)
            print(f"round {r} tracing {'on' if on else 'off'}: drain {res['imports_per_s']:.0f}/s"
                  + (f", http {got['rps']:.0f} req/s p99 {got['p99_ms']:.1f} ms" if got else ""), flush=True)
    sink.shutdown()

    med = statistics.median
    print(f"\ntracing study: {args.imports} small imports, {args.rounds} rounds, medians (on = OTLP export of every span)")
    print(f"drain imports/s: off {med(drain[False]):.0f}, on {med(drain[True]):.0f}, on ÷ off {med(drain[True]) / med(drain[False]):.2f}")
    if http[False] and http[True]:
        for key, unit in (("rps", "req/s"), ("p99_ms", "ms p99")):
            off, on_ = med(h[key] for h in http[False]), med(h[key] for h in http[True])
            print(f"HTTP {unit}: off {off:.1f}, on {on_:.1f}, on ÷ off {on_ / off:.2f}")
    print(f"the hooks when off: {hooks_off_ns():.0f} ns per POST (a span and a traceparent asked for)")


if __name__ == "__main__":
    main()
