"""[trace] The console exporter: with OTEL_TRACES_EXPORTER=console a process prints its spans
(in a child process: turning tracing on is for the whole process)."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
from opentelemetry import trace
from importer.adapters import tracing
from importer.adapters.settings import Settings
assert tracing.span("off") is tracing.span("still off")  # off: one shared no-op
assert tracing.setup(Settings.from_env({"OTEL_TRACES_EXPORTER": "console"}), "importer-test")
with tracing.span("outer") as outer:
    parent = tracing.traceparent()
    assert parent.startswith("00-") and tracing.trace_id() in parent
with tracing.span("child", parent=parent):
    pass
trace.get_tracer_provider().shutdown()
"""


def test_console_exporter_prints_every_span_and_a_traceparent_continues_the_trace() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True).stdout
    decoder, spans, at = json.JSONDecoder(), [], out.find("{")
    while at != -1:
        span, end = decoder.raw_decode(out, at)
        spans.append(span)
        at = out.find("{", end)
    by_name = {s["name"]: s for s in spans}
    assert set(by_name) == {"outer", "child"}
    assert by_name["child"]["context"]["trace_id"] == by_name["outer"]["context"]["trace_id"]
    assert by_name["child"]["parent_id"] == by_name["outer"]["context"]["span_id"]
    assert by_name["outer"]["resource"]["attributes"]["service.name"] == "importer-test"
