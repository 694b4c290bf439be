"""The route table: one place that maps (method, path) to a handler, its
authentication and its OpenAPI operation, and one place that maps errors to
problem responses."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from importer.handlers import api as h
from importer.handlers.auth import KeyRing, bearer_token
from importer.handlers.http import Request, Response, problem

log = logging.getLogger("importer.http")

def _problem_response(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/problem+json": {"schema": "Problem"}}}


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    handler: Callable[[h.Api, Request], Response]
    operation: dict[str, Any]
    authenticated: bool = True
    pattern: re.Pattern[str] = field(init=False)

    def __post_init__(self) -> None:
        regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", self.template)
        object.__setattr__(self, "pattern", re.compile(f"^{regex}$"))


def _auth_errors() -> dict[str, Any]:
    return {"401": _problem_response("Missing or unknown API key (auth.required).")}

ROUTES: tuple[Route, ...] = (
    Route("POST", "/api/imports", h.enqueue, {
        "operationId": "enqueueImport",
        "summary": "Send a CSV shipment to be applied to stock exactly once",
        "description": (
            "Stores the upload, records the job (id `shipment-<batchId>`) and queues it. "
            "Sending a batchId whose job record still exists returns that job again and queues nothing. "
            "Send JSON `{batchId, csv}` or the raw CSV as text/csv with `?batchId=`."
        ),
        "parameters": [{
            "name": "batchId", "in": "query", "required": False,
            "description": "Required with text/csv bodies; with a JSON body it may be given and must then equal the body's batchId.",
            "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"},
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
            "400": _problem_response("The body is not valid JSON (request.bad_json)."),
            **_auth_errors(),
            "409": _problem_response(
                "The batchId is already bound to other content or another producer (batch.conflict). "
                "The answer is the same in both cases and reveals nothing about the other shipment."
            ),
            "413": _problem_response("The upload is larger than the limit (request.too_large)."),
            "415": _problem_response("Content type not supported (request.unsupported_media_type)."),
            "422": _problem_response("A field is not valid (request.invalid)."),
            "429": {
                "description": "Too many POSTs from this producer (request.rate_limited).",
                "headers": {"Retry-After": {"description": "Seconds to wait.", "schema": {"type": "integer"}}},
                "content": {"application/problem+json": {"schema": "Problem"}},
            },
            "503": _problem_response("The store is unreachable (service.unavailable)."),
        },
    }),
    Route("GET", "/api/imports/{jobId}", h.get_import, {
        "operationId": "getImport",
        "summary": "Read the stored record of one of your imports",
        "parameters": [{"name": "jobId", "in": "path", "required": True, "schema": {"type": "string"}}],
        "responses": {
            "200": {"description": "The job record.", "content": {"application/json": {"schema": "JobStatus"}}},
            **_auth_errors(),
            "404": _problem_response(
                "No record (job.not_found). Records are removed by retention after they finish, so this does not "
                "mean the batch was never applied."
            ),
            "503": _problem_response("The store is unreachable (service.unavailable)."),
        },
    }),
    Route("GET", "/api/shipments/{batchId}", h.get_shipment, {
        "operationId": "getShipment",
        "summary": "Whether and when one of your batches was applied (durable history)",
        "description": (
            "Answers from the done marker, which retention never removes: correct forever, "
            "even after the job record is gone."
        ),
        "parameters": [{"name": "batchId", "in": "path", "required": True, "schema": {"type": "string"}}],
        "responses": {
            "200": {"description": "The batch was applied.", "content": {"application/json": {"schema": "Shipment"}}},
            **_auth_errors(),
            "404": _problem_response("The batch was never applied (shipment.not_found)."),
            "503": _problem_response("The store is unreachable (service.unavailable)."),
        },
    }),
    Route("GET", "/health", h.health, {
        "operationId": "health",
        "summary": "Liveness of this HTTP process and its Redis",
        "description": "200 when the process is not closing and Redis answers PING. It does not claim a worker is free.",
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
            "401": _problem_response("Missing or wrong metrics token, or none configured (auth.required)."),
        },
    }, authenticated=False),
    Route("GET", "/openapi.yaml", h.openapi_document, {
        "operationId": "openapi",
        "summary": "This API's OpenAPI document",
        "security": [],
        "responses": {"200": {"description": "The document.", "content": {"application/yaml": {"schema": {"type": "object"}}}}},
    }, authenticated=False),
)


def dispatch(api: h.Api, keys: KeyRing, req: Request) -> Response:
    """Route, authenticate, call the handler; map every error to a problem response."""
    allowed: list[str] = []
    for route in ROUTES:
        match = route.pattern.fullmatch(req.path)
        if match is None:
            continue
        if route.method != req.method:
            allowed.append(route.method)
            continue
        if route.authenticated:
            token = bearer_token(req.headers.get("authorization"))
            owner = keys.owner_for(token) if token else None
            if owner is None:
                return problem(401, "auth.required", headers=(("WWW-Authenticate", 'Bearer realm="importer"'),))
            req = replace(req, owner=owner)
        req = replace(req, path_params=match.groupdict())
        try:
            return route.handler(api, req)
        except api.unavailable_errors:
            api.on_store_error()
            log.warning("store unavailable", extra={"event": "http.store_unavailable", "path": route.template})
            return problem(503, "service.unavailable", headers=(("Retry-After", "5"),))
        except Exception:
            log.exception("unhandled error", extra={"event": "http.internal_error", "path": route.template})
            return problem(500, "internal")
    if allowed:
        return problem(405, "request.method_not_allowed", headers=(("Allow", ", ".join(sorted(set(allowed)))),))
    return problem(404, "request.not_found")
