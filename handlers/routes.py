"""The route table: one place that maps (method, path) to a handler, its
authentication, its OpenAPI operation and the error codes it can answer;
and :func:`resolve`, which the edge calls once per request: the
:class:`Resolved` route then runs its before-body checks and its handler, the one place that turns raised errors into problem
responses (statuses from handlers/problems.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from importer.domain.shipment import BATCH_ID_PATTERN
from importer.handlers import api as h
from importer.handlers import bulk, console, history, my_imports, ops, receipts, rejections
from importer.handlers.schemas import LOCATION_PARAMETER
from importer.handlers.answers import answer_for
from importer.handlers.auth import KeyRing, bearer_token
from importer.handlers.http import Request, Response, problem_of
from importer.handlers.problems import ApiError

@dataclass(frozen=True)
class Route:
    method: str
    template: str
    handler: Callable[[h.Api, Request], Response]
    operation: dict[str, Any]
    authenticated: bool = True
    #: The error codes this route answers (their statuses come from handlers/problems.py).
    errors: tuple[str, ...] = ()
    #: Per-code notes for the OpenAPI descriptions, where the code's title is not enough.
    error_notes: dict[str, str] = field(default_factory=dict)
    #: Cheap checks run after authentication and before the body is read
    #: (e.g. the rate limit); each raises to refuse the request.
    before_body: tuple[Callable[[h.Api, Request], None], ...] = ()
    #: False: a POST without a body (none is read; the handler runs at once).
    reads_body: bool = True
    pattern: re.Pattern[str] = field(init=False)

    def __post_init__(self) -> None:
        # Literal parts escaped (the '.' of rejections.csv), {name} a path segment.
        regex = "".join(
            f"(?P<{part[1:-1]}>[^/]+)" if part.startswith("{") else re.escape(part)
            for part in re.split(r"(\{\w+\})", self.template)
        )
        object.__setattr__(self, "pattern", re.compile(f"^{regex}$"))


_JOB_NOT_FOUND = "No record (retention removes finished ones), another producer's, or one at a location the API key does not allow: one answer"
_SHIPMENT_NOT_FOUND = "The batch was never applied, is another producer's, or is at a location the API key does not allow: one answer for all"

#: Every authenticated route can answer these.
_API_ERRORS = ("auth.required", "auth.invalid", "service.unavailable")

ROUTES: tuple[Route, ...] = (
    Route("POST", "/api/imports", h.enqueue, {
        "operationId": "enqueueImport",
        "summary": "Send a CSV shipment to be applied to stock exactly once",
        "description": (
            "Stores the upload, records the job (id `shipment-<batchId>`, or `shipment-<batchId>@<location>` "
            "at a location other than main) and queues it. "
            "Sending a batchId whose job record still exists returns that job again and queues nothing. "
            "Send JSON `{batchId, csv}` or the raw CSV as text/csv with `?batchId=`."
        ),
        "parameters": [{
            "name": "batchId", "in": "query", "required": False,
            "description": "Required with text/csv bodies; with a JSON body it may be given and must then equal the body's batchId.",
            "schema": {"type": "string", "pattern": BATCH_ID_PATTERN},
        }, {
            **LOCATION_PARAMETER,
            "description": "The stock location; with a JSON body it may be given there instead (both: they must be equal).",
        }, {
            "name": "Content-Digest", "in": "header", "required": False,
            "description": (
                "RFC 9530 digest of the body, e.g. `sha-256=:<base64 of its SHA-256>:` (sha-256 or sha-512): "
                "a body that does not match it is refused and nothing is recorded. Recommended; required for a "
                "chunked body on a server that cannot report a cut one (granian, the default)."
            ),
            "schema": {"type": "string"},
        }],
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": "EnqueueRequest"},
            "text/csv": {"schema": {"type": "string"}},
        }},
        "responses": {
            "202": {
                "description": "Accepted: the job exists and is queued (or was already).",
                "headers": {"Location": {"description": "URL of the job status.", "schema": {"type": "string"}}},
                "content": {"application/json": {"schema": "JobAccepted"}},
            },
        },
    }, errors=(
        "request.bad_json", "request.incomplete", "request.bad_length", "request.bad_digest", "request.digest_mismatch", *_API_ERRORS,
        "batch.conflict", "request.length_required", "request.too_large",
        "request.unsupported_media_type", "request.invalid", "request.rate_limited", "service.busy",
        "contract.no_worker", "request.timeout", "location.not_found", "ledger.unavailable", "intake.paused", "auth.scope_required",
    ), error_notes={
        "auth.scope_required": "An operator's key (the ops scope) does not upload: use a producer's key",
        "ledger.unavailable": "Only the ledger can say whether this old batch was applied, and it does not answer; nothing recorded",
        "location.not_found": "No operator declared this location, or the API key names others (?location=, the body's, or the default); nothing recorded",
        "batch.conflict": (
            "The batchId is already bound to other content or another producer; the answer is the same "
            "in both cases and reveals nothing about the other shipment"
        ),
        "contract.no_worker": (
            "Live workers exist and none accepts the contract version this server sends (producerVersion; they "
            "accept acceptedVersions); nothing was recorded. With no live worker at all the import is accepted "
            "and waits"
        ),
    }, before_body=(h.refuse_operator_key, h.refuse_forbidden_location, h.take_rate_token)),
    Route(**bulk.ROUTE_SPEC),
    Route("GET", "/api/imports", my_imports.list_imports, {
        "operationId": "listImports",
        "summary": "List your own imports, newest first",
        "description": (
            "One page of the caller's job records (never another producer's), each as GET /api/imports/{jobId} "
            "answers it. Pass the answer's nextCursor as ?cursor= for the next page. Records are removed by "
            "retention some time after they finish, so the list holds recent imports only."
        ),
        "parameters": [
            {"name": "state", "in": "query", "required": False, "description": "Only imports in this state.",
             "schema": {"type": "string", "enum": ["waiting", "active", "retrying", "completed", "failed"]}},
            {"name": "limit", "in": "query", "required": False, "description": "Items per page (default 20).",
             "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}},
            {"name": "cursor", "in": "query", "required": False,
             "description": "The nextCursor of the previous page (opaque).", "schema": {"type": "string"}},
            {**LOCATION_PARAMETER, "description": "Only imports at this stock location (default: every location the API key allows)."},
        ],
        "responses": {
            "200": {"description": "One page.", "content": {"application/json": {"schema": "JobList"}}},
        },
    }, errors=(*_API_ERRORS, "request.invalid"), error_notes={
        "request.invalid": "state, limit or cursor is not valid (see fields)",
    }),
    Route("GET", "/api/imports/{jobId}/events", my_imports.job_events, {
        "operationId": "streamImportEvents",
        "summary": "Follow one of your imports live (Server-Sent Events)",
        "description": (
            "A text/event-stream of the job's events: waiting, active, progress (validated, committed), retrying, "
            "completed, failed; each `data:` line is a JobEvent as JSON, each `id:` its stream id. Stored events "
            "come first, so a late client sees the whole history. Send the last id you saw as `Last-Event-ID` to "
            "resume after it. A retried import's history holds its earlier chain's `failed`, then `waiting` with "
            "`{\"retry\": n}` and the new chain's events: the final event is the last one. "
            "The stream ends after the final event (completed or failed), after at most "
            "IMPORTER_EVENT_STREAM_MAX_DURATION seconds (reconnect with Last-Event-ID), or when the server shuts "
            "down; a comment line is sent at least every IMPORTER_EVENT_STREAM_HEARTBEAT seconds. Each process "
            "holds at most IMPORTER_MAX_EVENT_STREAMS streams: one more is refused with 503 service.busy. "
            "Browsers: EventSource cannot send the Authorization header; read it with fetch()."
        ),
        "parameters": [
            {"name": "jobId", "in": "path", "required": True, "schema": {"type": "string"}},
            {"name": "Last-Event-ID", "in": "header", "required": False,
             "description": "Resume after this event id (an id from this stream).", "schema": {"type": "string"}},
        ],
        "responses": {
            "200": {
                "description": "The event stream: a sequence of server-sent events, each described by this schema.",
                # The body is text; read as a sequence of events (as OpenAPI 3.2's
                # itemSchema puts it, and schemathesis checks it), each event is the object.
                "content": {"text/event-stream": {"schema": {"anyOf": [{"type": "string"}, {
                    "type": "object",
                    "required": ["data"],
                    "properties": {
                        "id": {"type": "string", "description": "The event's stream id (send it back as Last-Event-ID)."},
                        "event": {"type": "string", "enum": ["waiting", "active", "progress", "retrying", "completed", "failed"]},
                        "data": {
                            "type": "string", "description": "A JobEvent as JSON.",
                            "contentMediaType": "application/json",
                            "contentSchema": {"$ref": "#/components/schemas/JobEvent"},
                        },
                        "retry": {"type": "integer", "description": "Milliseconds to wait before reconnecting."},
                    },
                }]}}},
            },
        },
    }, errors=(*_API_ERRORS, "job.not_found", "request.stream_unsupported", "service.busy"), error_notes={
        "job.not_found": _JOB_NOT_FOUND,
        "request.stream_unsupported": "This deployment (serverless) cannot hold a stream open: poll instead",
        "service.busy": "This process holds IMPORTER_MAX_EVENT_STREAMS streams already",
    }),
    Route("POST", "/api/imports/{jobId}/retry", my_imports.retry, {
        "operationId": "retryImport",
        "summary": "Retry one of your failed imports",
        "description": (
            "Starts a new attempt chain of a failed import under the same job id, from its stored upload (kept "
            "with the failed record, for IMPORTER_KEEP_FAILED_AGE seconds: 24 h by default): the record is "
            "`waiting` again with `attempt` 0, its error cleared and `retries` counted, and its events go on "
            "with `waiting` (data `{\"retry\": n}`). Only a failure a retry can change is retried (its "
            "attempts ran out, its time limit, the store or a worker lost, a contract version or message the "
            "workers did not take); a failed CSV validation is not: the same bytes give the same issues. A "
            "retry never applies a shipment twice: if the batch was applied, the new attempt replays it. No "
            "body. Counts as a POST for the producer's rate limit."
        ),
        "parameters": [{"name": "jobId", "in": "path", "required": True, "schema": {"type": "string"}}],
        "responses": {
            "202": {
                "description": "Accepted: the import is waiting again and its message is queued.",
                "headers": {"Location": {"description": "URL of the job status.", "schema": {"type": "string"}}},
                "content": {"application/json": {"schema": "JobAccepted"}},
            },
        },
    }, errors=(*_API_ERRORS, "job.not_found", "job.not_retryable", "request.rate_limited", "contract.no_worker"), error_notes={
        "job.not_found": _JOB_NOT_FOUND,
        "job.not_retryable": (
            "The import is not failed (state), or failed for a reason a retry cannot change (errorCode: a CSV "
            "validation code, batch.conflict, stock.overflow, import.upload_missing); detail says why and what "
            "to do. Nothing changed"
        ),
        "contract.no_worker": (
            "Live workers exist and none accepts the contract version this server sends, as for a new import: "
            "nothing changed; retry once such workers run"
        ),
    }, reads_body=False),
    Route("GET", "/api/imports/{jobId}/rejections.csv", rejections.get_rejections, {
        "operationId": "getImportRejections",
        "summary": "Download every rejected row of one of your imports that failed CSV validation",
        "description": (
            "The located issues the validation kept, in file order (at most 10,000; the job's "
            "error.rejections says how many were found), as CSV (RFC 4180, UTF-8): header "
            "`line,column,code,message,value`, one row per issue; `value` is the offending cell's raw text "
            "(at most 100 characters). Safe to open in a spreadsheet: a cell starting with `=`, `+`, `-`, `@`, "
            "a tab or a carriage return (or their full-width forms) is prefixed with a single quote. When the "
            "report was cut, its last row has code `report.truncated` and says how many issues were found. "
            "Removed with the job record by retention."
        ),
        "parameters": [{"name": "jobId", "in": "path", "required": True, "schema": {"type": "string"}}],
        "responses": {
            "200": {
                "description": "The rejection report.",
                "headers": {"Content-Disposition": {
                    "description": "attachment; filename=\"<jobId>-rejections.csv\"", "schema": {"type": "string"},
                }},
                "content": {"text/csv": {"schema": {"type": "string"}}},
            },
        },
    }, errors=(*_API_ERRORS, "job.not_found", "rejections.not_found"), error_notes={
        "job.not_found": _JOB_NOT_FOUND,
        "rejections.not_found": (
            "The job is yours but has no rejection report: it is not finished, it completed, or it failed "
            "for a reason other than CSV validation"
        ),
    }),
    Route("GET", "/api/imports/{jobId}", h.get_import, {
        "operationId": "getImport",
        "summary": "Read the stored record of one of your imports",
        "parameters": [{"name": "jobId", "in": "path", "required": True, "schema": {"type": "string"}}],
        "responses": {
            "200": {"description": "The job record.", "content": {"application/json": {"schema": "JobStatus"}}},
        },
    }, errors=(*_API_ERRORS, "job.not_found"), error_notes={
        "job.not_found": _JOB_NOT_FOUND,
    }),
    *(Route(**spec) for spec in history.ROUTE_SPECS),
    *(Route(**spec) for spec in ops.ROUTE_SPECS),
    Route("GET", "/api/shipments/{batchId}", h.get_shipment, {
        "operationId": "getShipment",
        "summary": "Whether and when one of your batches was applied (durable history)",
        "description": (
            "Answers from the done marker, which retention never removes: correct forever, "
            "even after the job record is gone."
        ),
        "parameters": [
            {"name": "batchId", "in": "path", "required": True, "schema": {"type": "string"}}, LOCATION_PARAMETER,
        ],
        "responses": {
            "200": {"description": "The batch was applied.", "content": {"application/json": {"schema": "Shipment"}}},
        },
    }, errors=(*_API_ERRORS, "shipment.not_found", "request.invalid"), error_notes={"shipment.not_found": _SHIPMENT_NOT_FOUND}),
    Route("GET", "/api/shipments/{batchId}/receipt", receipts.get_receipt, {
        "operationId": "getShipmentReceipt",
        "summary": "What one of your applied batches changed: each SKU's stock before and after",
        "description": (
            "The receipt written by the apply script in the same atomic step as the stock change: one item per "
            "row of the file, in the file's order, with the SKU's units on hand just before and just after. "
            "Kept with the done marker, forever (job retention never removes it). Sending the batch again (a "
            "replay) never rewrites it: every read answers the same bytes. JSON by default; `Accept: text/csv` "
            "gives CSV (`sku,before,after`); any other explicit Accept gets 406 request.not_acceptable. "
            "Large receipts are streamed (no Content-Length)."
        ),
        "parameters": [
            {"name": "batchId", "in": "path", "required": True, "schema": {"type": "string"}}, LOCATION_PARAMETER,
        ],
        "responses": {
            "200": {
                "description": "The receipt.",
                "headers": {"Vary": {"description": "Accept: the answer depends on it.", "schema": {"type": "string"}}},
                "content": {
                    "application/json": {"schema": "Receipt"},
                    "text/csv": {"schema": {"type": "string"}, "example": "sku,before,after\nWIDGET-RED-01,0,10\n"},
                },
            },
        },
    }, errors=(*_API_ERRORS, "shipment.not_found", "request.invalid", "receipt.not_recorded", "request.not_acceptable", "response.too_large"),
    error_notes={
        "shipment.not_found": _SHIPMENT_NOT_FOUND,
        "receipt.not_recorded": "The batch was applied before receipts were recorded",
        "response.too_large": "Serverless deployments only: the receipt is larger than one Lambda answer can carry",
    }),
    Route("GET", "/health", h.health, {
        "operationId": "health",
        "summary": "Liveness of this HTTP process and its Redis",
        "description": (
            "200 when the process is not closing, Redis answers and accepts writes, and (on RabbitMQ) the broker "
            "takes a message; else 503 with the reason. It does not claim a worker is free. "
            "`workers` tells how many workers are live and which contract versions they accept, and whether "
            "this server's imports pass the door check (`acceptsImports`); none alive is still 200: imports "
            "are accepted and wait."
        ),
        "security": [],
        "responses": {
            "200": {"description": "Healthy.", "content": {"application/json": {"schema": "Health"}}},
            "503": {"description": "Closing or Redis unreachable.", "content": {"application/json": {"schema": "Health"}}},
        },
    }, authenticated=False),
    Route("GET", "/metrics", h.metrics, {
        "operationId": "metrics",
        "summary": "Prometheus metrics (queue-wide numbers and this process's Redis errors)",
        "description": "Needs the token set in IMPORTER_METRICS_TOKEN as a bearer token; with none set, nobody can read it.",
        "security": [{"metricsToken": []}],
        "responses": {
            "200": {"description": "Prometheus text format.", "content": {"text/plain": {"schema": {"type": "string"}}}},
        },
    }, authenticated=False, errors=("auth.required",), error_notes={
        "auth.required": "Missing or wrong metrics token, or none configured",
    }),
    Route("GET", "/openapi.yaml", h.openapi_document, {
        "operationId": "openapi",
        "summary": "This API's OpenAPI document",
        "security": [],
        "responses": {"200": {"description": "The document.", "content": {"application/yaml": {"schema": {"type": "object"}}}}},
    }, authenticated=False),
)


_LITERAL_PATHS = frozenset(route.template for route in ROUTES if "{" not in route.template)


@dataclass(frozen=True)
class Resolved:
    """A request matched to its route, its owner authenticated; what the edge
    does with it next, each step's errors answered by handlers/answers.py."""

    route: Route
    request: Request

    @property
    def takes_body(self) -> bool:
        return self.route.method == "POST" and self.route.reads_body

    def check_before_body(self, api: h.Api) -> Response | None:
        """The route's checks that come before its body is read (the rate limit): None, or the refusal."""
        req = self.request
        for check in self.route.before_body:
            refused = _mapped(api, req, lambda: check(api, req))
            if refused is not None:
                return refused
        return None

    def answer(self, api: h.Api, body: bytes = b"") -> Response:
        """Call the route's handler with the request (and its body, once read)."""
        req = self.request.with_body(body) if body else self.request
        response = _mapped(api, req, lambda: self.route.handler(api, req))
        assert response is not None
        return response


def resolve(keys: KeyRing, req: Request) -> Resolved | Response:
    """The route of a request and its authenticated owner, or the 404/405/401 answer.

    Needs no body: the transports call it before reading one (handlers/edge.py),
    so a request refused here costs no body read. HEAD is answered by the GET
    route (the edge drops the body)."""
    try:
        found = _route(keys, req)
    except ApiError as err:
        return problem_of(err)
    return found if isinstance(found, Response) else Resolved(*found)


def _mapped(api: h.Api, req: Request, step: Callable[[], Response | None]) -> Response | None:
    """Run one step; every error it raises becomes its answer (handlers/answers.py)."""
    try:
        return step()
    except Exception as exc:
        return answer_for(exc, path=req.path, unavailable=api.unavailable_errors, on_store_error=api.on_store_error)


def _route(keys: KeyRing, req: Request) -> tuple[Route, Request] | Response:
    # The console's static files (HEAD answered from GET: the edge drops the body).
    page = console.serve(replace(req, method="GET") if req.method == "HEAD" else req)
    if page is not None:
        return page
    allowed: list[str] = []
    for route in ROUTES:
        match = route.pattern.fullmatch(req.path)
        if match is None or (match.groupdict() and req.path in _LITERAL_PATHS):
            continue  # a literal path (/api/imports/bulk) is never a parameter's value
        if route.method != req.method and not (req.method == "HEAD" and route.method == "GET"):
            allowed.append(route.method)
            if route.method == "GET":
                allowed.append("HEAD")
            continue
        principal = req.principal
        if route.authenticated:
            token = bearer_token(req.headers.get("authorization"))
            principal = keys.principal_for(token) if token else None
            if principal is None:
                raise ApiError("auth.invalid" if token else "auth.required", (("WWW-Authenticate", 'Bearer realm="importer"'),))
        params = match.groupdict()
        if not all(_is_text(value) for value in params.values()):
            raise ApiError("request.not_found")  # e.g. a lone surrogate from a hand-made Lambda event
        return route, req.routed(params, principal)
    if allowed:
        raise ApiError("request.method_not_allowed", (("Allow", ", ".join(sorted(set(allowed)))),))
    raise ApiError("request.not_found")


def _is_text(value: str) -> bool:
    return not any("\ud800" <= ch <= "\udfff" for ch in value)  # a lone surrogate is not text (UTF-8 cannot encode it)
