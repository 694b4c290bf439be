"""Builds openapi.yaml from the route table and the marshmallow schemas (apispec).

``importer openapi`` prints it; ``importer openapi --write`` rewrites the
committed file. tests/unit/test_openapi.py fails when the two drift.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin

from importer.handlers import schemas
from importer.handlers.routes import ROUTES

SPEC_PATH = Path(__file__).resolve().parent.parent / "openapi.yaml"

_SCHEMAS = {
    "EnqueueRequest": schemas.EnqueueRequestSchema,
    "JobAccepted": schemas.JobAcceptedSchema,
    "JobStatus": schemas.JobStatusSchema,
    "Shipment": schemas.ShipmentSchema,
    "Health": schemas.HealthSchema,
    "Problem": schemas.ProblemSchema,
}


def _schema_name_resolver(schema: type) -> str:
    cls = schema if isinstance(schema, type) else type(schema)
    name = cls.__name__
    return name[: -len("Schema")] if name.endswith("Schema") else name


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
        "bearerAuth", {"type": "http", "scheme": "bearer", "description": "An API key issued with `importer keys create OWNER`."}
    )
    spec.components.security_scheme(
        "metricsToken", {"type": "http", "scheme": "bearer", "description": "The token set in IMPORTER_METRICS_TOKEN."}
    )
    for name, schema in _SCHEMAS.items():
        spec.components.schema(name, schema=schema)
    paths: dict[str, dict[str, dict]] = {}
    for route in ROUTES:
        paths.setdefault(route.template, {})[route.method.lower()] = copy.deepcopy(route.operation)
    for template, operations in paths.items():
        spec.path(path=template, operations=operations)
    return spec


@cache
def spec_yaml() -> str:
    return build_spec().to_yaml()
