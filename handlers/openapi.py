"""Builds openapi.yaml from the route table and the marshmallow schemas (apispec).

``importer openapi`` prints it; ``importer openapi --write`` rewrites the
committed file. tests/unit/test_openapi.py fails when the two drift.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin

from importer.domain.errors import explain
from importer.handlers import ops_schemas, schemas
from importer.handlers.problems import HEADERS_OF, status_of
from importer.handlers.routes import ROUTES, Route

SPEC_PATH = Path(__file__).resolve().parent.parent / "openapi.yaml"

_SCHEMAS = {
    "EnqueueRequest": schemas.EnqueueRequestSchema,
    "JobAccepted": schemas.JobAcceptedSchema,
    "JobStatus": schemas.JobStatusSchema,
    "JobList": schemas.JobListSchema,
    "JobEvent": schemas.JobEventSchema,
    "Shipment": schemas.ShipmentSchema,
    "ShipmentList": schemas.ShipmentListSchema,
    "Movement": schemas.MovementSchema,
    "MovementList": schemas.MovementListSchema,
    "StockLevel": schemas.StockLevelSchema,
    "Stock": schemas.StockSchema,
    "SkuStock": schemas.SkuStockSchema,
    "Receipt": schemas.ReceiptSchema,
    "Health": schemas.HealthSchema,
    "Problem": schemas.ProblemSchema,
    "BulkRequest": schemas.BulkRequestSchema,
    "BulkResults": schemas.BulkResultsSchema,
    **{name.removesuffix("Schema"): schema for name, schema in vars(ops_schemas).items()
       if name.startswith("Ops") and name.endswith("Schema")},
}


def _schema_name_resolver(schema: type) -> str:
    cls = schema if isinstance(schema, type) else type(schema)
    name = cls.__name__
    return name[: -len("Schema")] if name.endswith("Schema") else name


def error_responses(route: Route) -> dict[str, Any]:
    """The problem responses of a route, grouped by status from the one code -> status table."""
    by_status: dict[int, list[str]] = {}
    for code in route.errors:
        by_status.setdefault(status_of(code), []).append(code)
    out: dict[str, Any] = {}
    for status, codes in sorted(by_status.items()):
        response: dict[str, Any] = {
            "description": " ".join(f"{route.error_notes.get(code) or explain(code)[0]} ({code})." for code in codes),
            "content": {"application/problem+json": {"schema": "Problem"}},
        }
        headers = {name: doc for code in codes for name, doc in HEADERS_OF.get(code, {}).items()}
        if headers:
            response["headers"] = {
                name: {"description": doc, "schema": {"type": "integer" if name == "Retry-After" else "string"}}
                for name, doc in headers.items()
            }
        out[str(status)] = response
    return out


#: On every answer (handlers/edge.py finish()); in the document on every response.
REQUEST_ID_HEADER: dict[str, Any] = {
    "description": (
        "This request's id: the X-Request-Id the client sent when it is 1-128 characters of "
        "A-Z a-z 0-9 . _ : - (starting with a letter or digit), else a new one. Every log line "
        "of the request carries it, and a 500 answer names it."
    ),
    "required": True,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"},
}
_REQUEST_ID_REF = {"$ref": "#/components/headers/X-Request-Id"}


def _with_request_id(responses: dict[str, Any]) -> dict[str, Any]:
    """Every response documents the X-Request-Id header."""
    out = {}
    for status, response in responses.items():
        response = dict(response)
        response["headers"] = {**response.get("headers", {}), "X-Request-Id": _REQUEST_ID_REF}
        out[status] = response
    return out


def head_operation(get: dict[str, Any], template: str) -> dict[str, Any]:
    """HEAD on a GET route: the GET's answer (status, headers) without a body."""
    head = {key: copy.deepcopy(value) for key, value in get.items() if key not in ("description", "responses", "operationId")}
    head["operationId"] = get["operationId"] + "Head"
    head["summary"] = f"{get['summary']} (headers only)"
    head["description"] = (
        f"Answered like GET {template}, without a body: the same status and headers, and the "
        "Content-Length the GET body would have (none for a stream)."
    )
    head["responses"] = {
        status: {key: value for key, value in response.items() if key != "content"}
        for status, response in get["responses"].items()
    }
    return head


def build_spec() -> APISpec:
    spec = APISpec(
        title="Importer",
        version="1.0.0",
        # 3.1: nullable fields are exact ("type": [..., "null"], anyOf with
        # {"type": "null"}), where 3.0's nullable+$ref idioms admit any object.
        openapi_version="3.1.0",
        plugins=[MarshmallowPlugin(schema_name_resolver=_schema_name_resolver)],
        info={
            "description": (
                "Takes CSV shipment files, applies each to product stock exactly once, "
                "and lets the sender watch the import to the end. Errors are RFC 9457 problem "
                "documents (application/problem+json) with a stable `code`."
            )
        },
        security=[{"bearerAuth": []}],
    )
    spec.components.security_scheme(
        "bearerAuth", {"type": "http", "scheme": "bearer", "description": (
            "An API key issued with `importer keys create OWNER` (`--locations a,b`: a key for those stock "
            "locations only; at any other, every answer is as if nothing were there)."
        )}
    )
    spec.components.security_scheme(
        "metricsToken", {"type": "http", "scheme": "bearer", "description": "The token set in IMPORTER_METRICS_TOKEN."}
    )
    for name, schema in _SCHEMAS.items():
        spec.components.schema(name, schema=schema)
    spec.components.header("X-Request-Id", REQUEST_ID_HEADER)
    paths: dict[str, dict[str, dict[str, Any]]] = {}
    for route in ROUTES:
        operation = copy.deepcopy(route.operation)
        responses = {**operation["responses"], **error_responses(route)}
        operation["responses"] = _with_request_id(dict(sorted(responses.items())))
        paths.setdefault(route.template, {})[route.method.lower()] = operation
        if route.method == "GET":
            paths[route.template]["head"] = head_operation(operation, route.template)
    for template, operations in paths.items():
        spec.path(path=template, operations=operations)
    return spec


@cache
def spec_yaml() -> str:
    return build_spec().to_yaml()
