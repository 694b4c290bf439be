"""Hostile query values on the routes the ledger, the stock and the operators
serve, through the real processes (`importer serve` on granian, a worker,
`importer ledger`, a real PostgreSQL): every one answers 4xx with a stable code
and the field it names; none reaches PostgreSQL or Redis as a 500 or a 503.

Each case is a row of the probe that found them (issue 51): Unicode digits
in ``limit``, NULs, lone surrogates and deep nesting in cursors, a Redis
cursor past 2^64, instants whose echo overflowed the year, ISO 8601 forms
that are not RFC 3339, an empty bulk location, a NUL in a batchId."""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import quote

import pytest

from importer.handlers.auth import hash_key, new_key
from tests.integration.support import System
from tests.integration.test_history import get, imported, start_history_system

pytestmark = pytest.mark.integration


def cursor_of(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode("utf-8", "surrogatepass")).decode().rstrip("=")


@pytest.fixture
def hostile_system(make_system: Any, make_database: Any) -> tuple[System, str, str]:
    operator = new_key()
    system, reader = start_history_system(make_system, make_database, f"ops-desk:{hash_key(operator)} scopes=ops")
    return system, reader, operator


LIMIT_ROUTES = ("/api/imports", "/api/shipments", "/api/stock-movements", "/api/stock?location=main",
                "/api/ops/overview", "/api/ops/failed", "/api/ops/actions")
BAD_LIMITS = ("%C2%B2", "%E2%91%A0", "1" * 5000, "%D9%A1%D9%A0", "%EF%BC%95", "", "-1", "1.0", "%201", "10%00")
DEEP = "[" * 2000 + "]" * 2000
BAD_CURSORS = (
    '["v1",1,"main\\u0000","x"]', '["v1",1,"main","\\ud800"]', '["v1",1,"main","x",1,2]', DEEP,
    '["v1",' + DEEP + ',"main","x"]', '["v1",1e999,"main","x"]', '["v1",true,"main","x"]', '["v1",-1,"main","x"]',
    '["v1",1,"main","a,b"]', '["v1",1,"MAIN","x"]', '{"v1":1}',
)
BAD_INSTANTS = (
    "0001-01-01T00:00:00%2B14:00", "9999-12-31T23:59:59-14:00", "2026-12-01", "2026-W49-1", "20261201T000000Z",
    "2026-12-01T00:00:00Z%00", "2026-12-01T00:00:00", "2026-12-01%2000:00:00Z", "2026-12-01T24:00:00Z",
    "2026-12-01T00:00:60Z", "%D9%A2026-12-01T00:00:00Z", "2026-12-01T00:00:00%2B24:00", "1969-12-31T23:59:59Z",
)


def test_every_row_of_the_probe_answers_4xx_with_a_stable_code(hostile_system: tuple[System, str, str]) -> None:
    system, reader, operator = hostile_system
    imported(system, "hq-1", {"HQ-A": 3})
    key_of = {"/api/stock": reader, "/api/ops": operator}

    def answer(path: str) -> tuple[int, Any]:
        key = next((k for prefix, k in key_of.items() if path.startswith(prefix)), system.api_key)
        return get(system, path, key=key)

    def refused(path: str, field: str | None, status: int = 422, code: str = "request.invalid") -> None:
        got, problem = answer(path)
        assert got == status and problem["code"] == code, (path, got, problem)
        if field is not None:
            assert field in problem["fields"], (path, problem)
        assert "Traceback" not in json.dumps(problem) and "psycopg" not in json.dumps(problem)

    # 1. a NUL in a batchId: never applied, so 404 (it reached PostgreSQL and came back 503 before)
    for path in ("/api/shipments/x%00", "/api/shipments/x%00/receipt", "/api/shipments/%C2%B2"):
        refused(path, None, 404, "shipment.not_found")
    # 2. limits that are not ASCII digits within bounds
    for route in LIMIT_ROUTES:
        for bad in BAD_LIMITS:
            refused(f"{route}{'&' if '?' in route else '?'}limit={bad}", "limit")
    # 3, 4. forged cursors: NULs, lone surrogates, deep nesting, wrong types and characters
    for route in ("/api/shipments", "/api/stock-movements", "/api/imports"):
        for raw in BAD_CURSORS:
            refused(f"{route}?cursor={cursor_of(raw)}", "cursor")
    for route in ("/api/ops/overview", "/api/ops/failed", "/api/ops/actions", "/api/stock?location=main",
                  "/api/stock?location=main&asOf=2026-12-01T00:00:00Z"):
        for raw in ('["v1","x\\u0000"]', '["v1","\\udfff"]', DEEP, '["v1",' + DEEP + "]"):
            refused(f"{route}&cursor={cursor_of(raw)}" if "?" in route else f"{route}?cursor={cursor_of(raw)}", "cursor")
    refused("/api/shipments?cursor=" + "A" * 600, "cursor")
    refused("/api/shipments?cursor=%00%00", "cursor")
    # 5. a Redis SCAN cursor past what Redis takes
    for big in (2**64, 2**63, -1):
        refused(f"/api/stock?location=main&cursor={cursor_of(json.dumps(['v1', big]))}", "cursor")
    # 6, 7. instants: out of range, or not RFC 3339 with an offset
    for bad in BAD_INSTANTS:
        refused(f"/api/stock?location=main&asOf={bad}", "asOf")
        refused(f"/api/stock/HQ-A?location=main&asOf={bad}", "asOf")
        refused(f"/api/shipments?from={bad}", "from")
        refused(f"/api/stock-movements?to={bad}", "to")
    # 8. an empty bulk location: the whole request, as the spec's pattern says
    status, _, raw = system.request(
        "POST", "/api/imports/bulk?location=", body=b'{"batchId":"hq-b","csv":"sku,quantity\\nHQ-A,1\\n"}\n',
        ctype="application/x-ndjson",
    )
    assert status == 422 and "location" in json.loads(raw)["fields"], raw
    assert get(system, "/api/imports/shipment-hq-b")[0] == 404  # nothing recorded
    # 9. other codes on the ops routes
    refused("/api/ops/failed?errorCode=x%00", "errorCode")

    # What is valid still answers, at the range's ends too.
    for path in ("/api/shipments?limit=500&from=1970-01-01T00:00:00Z&to=9999-12-30T23:59:59.999Z",
                 "/api/stock-movements?from=2026-12-01T01:00:00.123456789%2B01:00",
                 f"/api/stock?location=main&asOf={quote('9999-12-31T10:00:00+12:00')}",
                 "/api/stock/HQ-A?location=main&asOf=1970-01-01T00:00:00z", "/api/ops/overview?limit=200"):
        assert answer(path)[0] == 200, path

    log = "".join(p.log() for p in system.procs if p.name == "http")
    assert "http.store_unavailable" not in log and "http.internal_error" not in log


def test_an_operators_key_does_not_upload(hostile_system: tuple[System, str, str]) -> None:
    """docs/security.md, "Scopes": operators act on others' imports; stock comes from producers' keys."""
    system, _, operator = hostile_system
    status, _, raw = system.request("POST", "/api/imports?batchId=ops-up", body=b"sku,quantity\nHQ-O,1\n",
                                    ctype="text/csv", key=operator)
    assert status == 403 and json.loads(raw)["code"] == "auth.scope_required", raw
    status, _, raw = system.request("POST", "/api/imports/bulk", key=operator, ctype="application/x-ndjson",
                                    body=b'{"batchId":"ops-up2","csv":"sku,quantity\\nHQ-O,1\\n"}\n')
    assert status == 403 and json.loads(raw)["code"] == "auth.scope_required", raw
    assert get(system, "/api/ops/imports/shipment-ops-up", key=operator)[0] == 404  # nothing recorded
    assert get(system, "/api/ops/imports/shipment-ops-up2", key=operator)[0] == 404
    assert get(system, "/api/ops/overview", key=operator)[0] == 200  # its own routes still answer
