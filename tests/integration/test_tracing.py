"""[trace] One trace from a producer's POST to the stock change, across the real
`importer serve` and `importer worker` processes, exported over OTLP/HTTP
(the SDK's exporter, ``OTEL_TRACES_EXPORTER=otlp``) to a collector this test
runs: the client's traceparent is honoured, the worker's attempt continues the
POST's trace, a retry's attempt is a new span of the same trace, and the log
lines of every step carry the trace id."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse

from tests.integration.support import FIXTURES, System, wait_for

pytestmark = pytest.mark.integration

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


class Collector:
    """An OTLP/HTTP trace receiver: every span it was sent, as a dict."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        lock = self.lock = threading.Lock()
        spans = self.spans

        class Receive(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                for resource in request.resource_spans:
                    service = next(a.value.string_value for a in resource.resource.attributes if a.key == "service.name")
                    for scope in resource.scope_spans:
                        with lock:
                            spans.extend({
                                "service": service, "name": s.name, "trace": s.trace_id.hex(), "id": s.span_id.hex(),
                                "parent": s.parent_span_id.hex(), "error": s.status.code == 2,
                                "attributes": {a.key: a.value.string_value or a.value.int_value for a in s.attributes},
                                "links": [link.span_id.hex() for link in s.links],
                            } for s in scope.spans)
                body = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Receive)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def named(self, name: str, trace: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["name"] == name and s["trace"] == trace]


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector()
    yield found
    found.server.shutdown()
    found.server.server_close()


def test_one_trace_spans_the_post_the_worker_and_a_retry(make_system: Any, collector: Collector) -> None:
    system: System = make_system(OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
                                 OTEL_BSP_SCHEDULE_DELAY="100", IMPORTER_LOG_LEVEL="debug")  # import.applied: a debug line
    system.start_http()
    # A retryable failure first: a worker that reads only contract version 2.
    status, _, body = system.request("POST", "/api/imports?batchId=traced", body=SEED, ctype="text/csv",
                                     headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    assert status == 202, body
    odd = system.start_worker(IMPORTER_ACCEPTED_VERSIONS="2")
    system.wait_state("shipment-traced", ("failed",))
    odd.stop()

    (post,) = wait_for(lambda: collector.named("POST /api/imports", CLIENT_TRACE), 15, message="the POST's span")
    assert (post["service"], post["parent"]) == ("importer-http", CLIENT_SPAN)  # the client's trace goes on
    assert post["attributes"]["http.response.status_code"] == 202
    (enqueue,) = wait_for(lambda: collector.named("enqueue.lua", CLIENT_TRACE), 15, message="the enqueue span")
    assert enqueue["parent"] == post["id"] and enqueue["attributes"]["importer.job_id"] == "shipment-traced"
    first = wait_for(lambda: collector.named("import attempt", CLIENT_TRACE), 15, message="the failed attempt")
    assert first[0]["service"] == "importer-worker" and first[0]["parent"] == enqueue["id"] and first[0]["error"]

    # The retry: a new request (a new trace of its own), whose attempt is a new span of the import's trace.
    system.start_worker()
    status, _, body = system.request("POST", "/api/imports/shipment-traced/retry")
    assert status == 202, body
    assert system.wait_state("shipment-traced", ("completed",))["retries"] == 1
    attempts = wait_for(lambda: [s for s in collector.named("import attempt", CLIENT_TRACE) if not s["error"]],
                        15, message="the retry's attempt")
    (retried,) = attempts
    assert retried["id"] not in {s["id"] for s in first} and retried["parent"] == enqueue["id"]
    (applied,) = wait_for(lambda: collector.named("start_apply.lua", CLIENT_TRACE), 15, message="the apply span")
    assert applied["parent"] == retried["id"] and applied["service"] == "importer-worker"
    def retry_requests() -> list[dict[str, Any]]:
        with collector.lock:
            return [s for s in collector.spans if s["name"] == "POST /api/imports/{id}/retry"]
    # The HTTP process exports its spans in batches: the retry's may land after the worker's.
    retry_request = wait_for(retry_requests, 15, message="the retry request's span")
    assert len(retry_request) == 1 and retry_request[0]["trace"] != CLIENT_TRACE

    # The logs of each step name the trace (JSON lines: traceId beside requestId).
    worker_lines = [json.loads(line) for p in system.procs if p.name == "worker" for line in p.log().splitlines()
                    if line.startswith("{")]
    traced = [line for line in worker_lines if line.get("traceId") == CLIENT_TRACE]
    assert {line["event"] for line in traced} >= {"import.applied"}, worker_lines
    assert all(line.get("requestId") for line in traced if line.get("event") == "import.applied")


def test_tracing_off_exports_nothing_and_keeps_no_traceparent(make_system: Any, collector: Collector) -> None:
    system: System = make_system(OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint)  # OTEL_TRACES_EXPORTER unset: off
    system.start_http()
    system.start_worker()
    status, _, body = system.request("POST", "/api/imports?batchId=untraced", body=SEED, ctype="text/csv",
                                     headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    assert status == 202, body
    system.wait_state("shipment-untraced", ("completed",))
    assert system.store().client.hget(system.prefix + "job:shipment-untraced", "traceparent") is None
    assert collector.spans == []


def test_an_import_that_rode_in_another_deliverys_call_has_its_own_attempt_in_its_own_trace(
    make_system: Any, collector: Collector,
) -> None:
    """A backlog drained several imports per call: each import's trace still goes
    from its POST to an attempt of its own; a rider's attempt links to the
    attempt of the delivery whose call applied it."""
    system: System = make_system(OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
                                 OTEL_BSP_SCHEDULE_DELAY="100", IMPORTER_APPLY_TOGETHER_MAX="16", IMPORTER_RATE_LIMIT="0",
                                 IMPORTER_LOG_LEVEL="debug")  # import.applied: a debug line
    system.start_http()
    traces = {f"rd-{i}": f"{i + 1:032x}" for i in range(24)}
    for batch_id, trace in traces.items():
        status, _, body = system.request("POST", f"/api/imports?batchId={batch_id}", body=SEED, ctype="text/csv",
                                         headers={"traceparent": f"00-{trace}-{CLIENT_SPAN}-01"})
        assert status == 202, body
    system.start_worker(threads=2, prefetch=64)
    assert all(system.wait_state(f"shipment-{b}")["state"] == "completed" for b in traces)

    def attempts() -> dict[str, dict[str, Any]] | None:
        found = {b: collector.named("import attempt", t) for b, t in traces.items()}
        return {b: a[0] for b, a in found.items()} if all(len(a) == 1 for a in found.values()) else None

    attempt = wait_for(attempts, 15, message="one attempt span in each import's trace")
    enqueues = {b: wait_for(lambda t=t: collector.named("enqueue.lua", t), 15, message="enqueue spans")[0] for b, t in traces.items()}
    assert all(attempt[b]["parent"] == enqueues[b]["id"] for b in traces)
    assert all(attempt[b]["attributes"]["importer.job_id"] == f"shipment-{b}" for b in traces)
    riders = [b for b in traces if attempt[b]["links"]]
    leaders = {s["id"] for s in attempt.values() if not s["links"]}
    assert riders, "no import rode in another delivery's call"
    # Each rider's link names the attempt of a leader, in that leader's own trace; only leaders ran a script call.
    assert all(attempt[b]["links"][0] in leaders for b in riders)
    applied = {b: collector.named("start_apply.lua", t) for b, t in traces.items()}
    assert all(not applied[b] for b in riders) and all(len(applied[b]) == 1 for b in traces if b not in riders)
    # Each import's log line names its own trace and request, a rider's too.
    lines = [json.loads(line) for p in system.procs if p.name == "worker" for line in p.log().splitlines()
             if line.startswith("{")]
    logged = {line["jobId"]: line for line in lines if line.get("event") == "import.applied"}
    assert {b: logged[f"shipment-{b}"].get("traceId") for b in traces} == traces
    assert all(logged[f"shipment-{b}"].get("requestId") for b in traces)
