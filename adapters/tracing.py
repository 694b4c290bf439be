"""[trace] OpenTelemetry traces from a POST to the stock change, across processes.

Off unless ``OTEL_TRACES_EXPORTER`` names ``console`` or ``otlp`` and the SDK is
installed (``pip install 'importer[otel]'``); then the composition roots call
:func:`setup` and every process exports its spans (``OTEL_SERVICE_NAME``,
``OTEL_EXPORTER_OTLP_ENDPOINT`` and the SDK's other variables apply as usual).
Off, every hook below returns at its first line: no span, no context, no cost.

The spans of one import:

* ``POST /api/imports`` (server; the child of the client's ``traceparent``);
* ``enqueue.lua`` (client): the script that records the job and its message;
  the message's ``traceparent`` option and the job record's ``traceparent``
  field carry its context on;
* ``import attempt`` (consumer, in the worker): one per delivery, the child of
  the message's context; a retry's message carries the record's, so a retried
  import's new attempt is a new span in the same trace. An import that rode in
  another delivery's call (a rider) gets its own, linked to that delivery's;
* ``apply`` (client): the script that applies the shipment to stock.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from importer.adapters.settings import Settings

_tracer: trace.Tracer | None = None


def setup(settings: Settings, service: str) -> bool:
    """Start exporting spans when OTEL_TRACES_EXPORTER asks for it; True when on."""
    global _tracer
    exporter_name = settings.traces_exporter
    if exporter_name in ("", "none") or _tracer is not None:
        return _tracer is not None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    exporter: SpanExporter
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    elif exporter_name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    else:
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter_name!r}: Importer exports to 'console', 'otlp' or 'none'")
    resource = Resource.create({} if settings.otel_service_name else {SERVICE_NAME: service})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("importer")
    return True


def on() -> bool:
    return _tracer is not None


_OFF: AbstractContextManager[None] = nullcontext()


def span(name: str, kind: SpanKind = SpanKind.INTERNAL, *, parent: str = "", headers: Mapping[str, str] | None = None,
         attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[trace.Span | None]:
    """A span, the current one's child, or (``parent``: a W3C traceparent; ``headers``: a
    request's) the child of the remote context they carry. Off: a shared no-op (None)."""
    if _tracer is None:
        return _OFF
    return _span(_tracer, name, kind, parent, headers, attributes)


@contextmanager
def _span(tracer: trace.Tracer, name: str, kind: SpanKind, parent: str, headers: Mapping[str, str] | None,
          attributes: Mapping[str, Any] | None) -> Iterator[trace.Span]:
    context = None
    if parent:
        context = propagate.extract({"traceparent": parent})
    elif headers is not None:
        context = propagate.extract(headers)
    with tracer.start_as_current_span(name, context=context, kind=kind, attributes=dict(attributes or {})) as current:
        yield current


def linked_span(name: str, kind: SpanKind, *, parent: str, start_ns: int,
                attributes: Mapping[str, Any]) -> AbstractContextManager[trace.Span | None]:
    """A span begun at ``start_ns`` (already past), the child of ``parent`` (a W3C
    traceparent), linked to the current span, and current until it ends: the work of
    an import done inside another delivery's span (a rider). Off: a shared no-op."""
    if _tracer is None:
        return _OFF
    context = propagate.extract({"traceparent": parent}) if parent else None
    current = trace.get_current_span().get_span_context()
    links = [trace.Link(current)] if current.is_valid else None
    return _tracer.start_as_current_span(name, context=context, kind=kind, attributes=dict(attributes), links=links,
                                         start_time=start_ns)


def set_error(current: trace.Span | None, code: str) -> None:
    if current is not None:
        current.set_status(Status(StatusCode.ERROR, code))


def traceparent() -> str:
    """The current span's W3C traceparent ('' when tracing is off or no span is current)."""
    if _tracer is None:
        return ""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent", "")


def trace_id() -> str | None:
    """The current trace's id for log lines (None when off or outside a span)."""
    if _tracer is None:
        return None
    context = trace.get_current_span().get_span_context()
    return trace.format_trace_id(context.trace_id) if context.is_valid else None


#: A path's variable segment (a job id, a batchId) in a span's name: one name per route.
_VARIABLE = re.compile(r"^(/api/(?:imports|shipments|stock|ops/imports))/[^/]+")


def traced_request(head: Any, request_id: str, handle: Callable[[], Any]) -> Any:
    """One HTTP request (handlers/http.py's Request and Response) inside its server span,
    the child of the client's ``traceparent`` if it sent one."""
    name = f"{head.method} {_VARIABLE.sub(lambda m: m.group(1) + '/{id}', head.path)}"
    attributes = {"http.request.method": head.method, "url.path": head.path, "importer.request_id": request_id}
    with span(name, SpanKind.SERVER, headers=head.headers, attributes=attributes) as current:
        response = handle()
        if current is not None:
            current.set_attribute("http.response.status_code", response.status)
            if response.status >= 500:
                set_error(current, str(response.status))
        return response
