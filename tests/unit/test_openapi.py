"""openapi.yaml: committed file == generated document, valid OpenAPI 3.0,
covers every route, and describes the bodies the handlers really produce."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema.exceptions import ValidationError
from openapi_schema_validator import OAS31Validator, oas31_format_checker
from openapi_spec_validator import validate as validate_spec

from importer.handlers.openapi import SPEC_PATH, spec_yaml
from importer.handlers.routes import ROUTES
from tests.unit.test_http_handlers import KEY_B, VALID_CSV, Harness, Result, make_harness, record, shipment

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "openapi.yaml"


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    loaded = yaml.safe_load(COMMITTED.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def test_committed_spec_is_the_generated_one() -> None:
    assert SPEC_PATH == COMMITTED
    generated = spec_yaml()
    assert COMMITTED.read_bytes() == generated.encode("utf-8"), "openapi.yaml is stale: run `importer openapi --write`"


def test_spec_is_valid_openapi(spec: dict[str, Any]) -> None:
    assert spec["openapi"].startswith("3.1.")
    validate_spec(spec)


def test_every_route_is_documented_and_nothing_else(spec: dict[str, Any]) -> None:
    documented = {(path, method.upper()) for path, ops in spec["paths"].items() for method in ops}
    routed = {(route.template, route.method) for route in ROUTES}
    # HEAD is answered on every GET route (handlers/edge.py) and documented with it.
    heads = {(route.template, "HEAD") for route in ROUTES if route.method == "GET"}
    assert heads and documented == routed | heads
    for route in ROUTES:
        operation = spec["paths"][route.template][route.method.lower()]
        assert operation["operationId"] == route.operation["operationId"]
        if route.authenticated:
            assert "security" not in operation  # the global bearerAuth applies
        else:
            # open (security: []) or its own scheme, never the producers' API keys
            assert "security" in operation and {"bearerAuth": []} not in operation["security"]


def test_head_is_documented_like_get_without_a_body(spec: dict[str, Any]) -> None:
    for route in ROUTES:
        if route.method != "GET":
            continue
        get, head = (spec["paths"][route.template][m] for m in ("get", "head"))
        assert head["operationId"] == get["operationId"] + "Head"
        assert head.get("security") == get.get("security") and head.get("parameters") == get.get("parameters")
        assert set(head["responses"]) == set(get["responses"]), route.template
        for status, response in head["responses"].items():
            assert "content" not in response, (route.template, status)
            assert response.get("headers") == get["responses"][status].get("headers")


def test_every_response_documents_the_request_id_header(spec: dict[str, Any]) -> None:
    header = spec["components"]["headers"]["X-Request-Id"]
    assert header["required"] is True
    count = 0
    for operations in spec["paths"].values():
        for operation in operations.values():
            for response in operation["responses"].values():
                assert response["headers"]["X-Request-Id"] == {"$ref": "#/components/headers/X-Request-Id"}
                count += 1
    assert count > 30


def test_authenticated_routes_document_401(spec: dict[str, Any]) -> None:
    for route in ROUTES:
        if route.authenticated:
            assert "401" in spec["paths"][route.template][route.method.lower()]["responses"], route.template


# -- real response bodies against the documented schemas ----------------------------


def validator_for(spec: dict[str, Any], path: str, method: str, status: int, media_type: str) -> OAS31Validator:
    """The validator of the schema the spec declares for this response (its $ref resolved in the document)."""
    response = spec["paths"][path][method]["responses"][str(status)]
    schema = response["content"][media_type]["schema"]
    return OAS31Validator({**schema, "components": spec["components"]}, format_checker=oas31_format_checker)


def _accepted(h: Harness) -> Result:
    return h.post_json({"batchId": "b-spec", "csv": VALID_CSV})


def _new_job(h: Harness) -> Result:
    _accepted(h)
    return h.get_job("shipment-b-spec")


def _finished_job(h: Harness) -> Result:
    h.store.jobs["shipment-b-full"] = record()
    return h.get_job("shipment-b-full")


def _failed_job(h: Harness) -> Result:
    error = {
        "code": "csv.bad_quantity", "message": "fix it", "issuesTruncated": True,
        "issues": [{"line": 2, "column": None, "code": "csv.bad_row", "message": "two columns"}],
    }
    h.store.jobs["shipment-b-err"] = record(id="shipment-b-err", state="failed", result=None, error=error)
    return h.get_job("shipment-b-err")


def _retried(h: Harness, code: str = "import.attempts_exhausted") -> Result:
    _accepted(h)
    from dataclasses import replace

    from importer.domain.errors import PublicError

    job = h.store.jobs["shipment-b-spec"]
    h.store.jobs["shipment-b-spec"] = replace(job, state="failed", error=PublicError.from_code(code).to_dict())
    return h.call("POST", "/api/imports/shipment-b-spec/retry")


def _invalid(h: Harness) -> Result:
    return h.post_json({"batchId": "bad id!", "extra": 1})


def _conflict(h: Harness) -> Result:
    _accepted(h)
    return h.post_json({"batchId": "b-spec", "csv": VALID_CSV}, key=KEY_B)


def _not_found(h: Harness) -> Result:
    return h.get_job("shipment-unknown")


def _unauthenticated(h: Harness) -> Result:
    return h.get_job("shipment-unknown", key=None)


def _applied_shipment(h: Harness) -> Result:
    h.store.shipments["b-done"] = shipment(result={"imported": 3, "batchId": "b-done", "replay": True})
    return h.call("GET", "/api/shipments/b-done")


def _health_closing(h: Harness) -> Result:
    h.api.lifecycle.begin_closing()
    return h.call("GET", "/health", key=None)


CASES: list[tuple[str, Callable[[Harness], Result], str, str, int, str]] = [
    ("202-accepted", _accepted, "/api/imports", "post", 202, "application/json"),
    ("200-new-job", _new_job, "/api/imports/{jobId}", "get", 200, "application/json"),
    ("200-finished-job", _finished_job, "/api/imports/{jobId}", "get", 200, "application/json"),
    ("200-failed-job", _failed_job, "/api/imports/{jobId}", "get", 200, "application/json"),
    ("200-shipment", _applied_shipment, "/api/shipments/{batchId}", "get", 200, "application/json"),
    ("404-shipment-problem", lambda h: h.call("GET", "/api/shipments/b-never"), "/api/shipments/{batchId}", "get", 404,
     "application/problem+json"),
    ("200-health", lambda h: h.call("GET", "/health", key=None), "/health", "get", 200, "application/json"),
    ("503-health", _health_closing, "/health", "get", 503, "application/json"),
    ("422-problem", _invalid, "/api/imports", "post", 422, "application/problem+json"),
    ("409-problem", _conflict, "/api/imports", "post", 409, "application/problem+json"),
    ("202-retried", _retried, "/api/imports/{jobId}/retry", "post", 202, "application/json"),
    ("409-not-retryable", lambda h: _retried(h, "csv.bad_row"), "/api/imports/{jobId}/retry", "post", 409,
     "application/problem+json"),
    ("404-problem", _not_found, "/api/imports/{jobId}", "get", 404, "application/problem+json"),
    ("401-problem", _unauthenticated, "/api/imports/{jobId}", "get", 401, "application/problem+json"),
]


@pytest.mark.parametrize(
    "produce,path,method,status,media_type", [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_response_bodies_match_their_documented_schema(
    spec: dict[str, Any], produce: Callable[[Harness], Result], path: str, method: str, status: int, media_type: str
) -> None:
    result = produce(make_harness())

    assert result.status == status, result.body
    assert result.header("Content-Type") == media_type
    validator_for(spec, path, method, status, media_type).validate(result.json())


def test_schema_check_is_not_vacuous(spec: dict[str, Any]) -> None:
    body = _new_job(make_harness()).json()
    checker = validator_for(spec, "/api/imports/{jobId}", "get", 200, "application/json")
    for broken in ({**body, "owner": "owner-a"}, {**body, "state": "lost"}, {**body, "createdAt": "yesterday"}):
        with pytest.raises(ValidationError):
            checker.validate(broken)
    problem = validator_for(spec, "/api/imports/{jobId}", "get", 404, "application/problem+json")
    with pytest.raises(ValidationError):
        problem.validate({"type": "x", "title": "x", "status": "404", "detail": "x", "code": "x"})
