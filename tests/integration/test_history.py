"""The stock history read from the ledger, through the real processes
(`importer serve`, `importer worker`, `importer ledger`, a real PostgreSQL):
the owner's applied shipments, stock movements (pages and CSV), and stock
levels now and as of a time for keys with the stock:read scope."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

import pytest

from importer.domain.shipment import job_id_for
from importer.handlers.auth import hash_key, new_key
from tests.integration.support import System, wait_for

pytestmark = pytest.mark.integration


def shipment(rows: dict[str, int]) -> bytes:
    return ("sku,quantity\n" + "".join(f"{sku},{q}\n" for sku, q in rows.items())).encode()


def get(system: System, path: str, key: str | None = None, accept: str | None = None) -> tuple[int, Any]:
    headers = {"Accept": accept} if accept else {}
    status, _, body = system.request("GET", path, key=key or system.api_key, headers=headers)
    if accept == "text/csv" and status == 200:
        return status, body.decode()
    return status, json.loads(body) if body else None


@pytest.fixture
def history_system(make_system: Any, make_database: Any) -> tuple[System, str]:
    reader = new_key()
    system = make_system(IMPORTER_DATABASE_URL=make_database(), IMPORTER_LEDGER_INTERVAL="0.05")
    system.env_overrides["IMPORTER_API_KEYS"] = (
        f"owner-a:{hash_key(system.api_key)},owner-b:{hash_key(system.other_key)},"
        f"stock-desk:{hash_key(reader)} scopes=stock:read"
    )
    system.start_worker()
    system.start_http()
    system.start_ledger()
    return system, reader


def imported(system: System, batch_id: str, rows: dict[str, int], location: str = "main", key: str | None = None) -> int:
    kw = {"key": key} if key else {}
    status, _, body = system.request(
        "POST", f"/api/imports?batchId={batch_id}&location={location}", body=shipment(rows), ctype="text/csv", **kw,
    )
    assert status == 202, body
    record = wait_for(lambda: (r := system.get_job(job_id_for(batch_id, location), **kw))[0] == 200
                      and r[1]["state"] == "completed" and r[1], 30, 0.05, message=batch_id)
    return int(time.time() * 1000)


def test_shipments_movements_and_stock_from_the_ledger(history_system: tuple[System, str]) -> None:
    system, reader = history_system
    imported(system, "h-1", {"HIST-A": 10, "HIST-B": 1})
    time.sleep(0.05)
    imported(system, "h-2", {"HIST-A": 5})
    between = int(time.time() * 1000)
    time.sleep(0.05)
    imported(system, "h-3", {"HIST-A": 2}, location="paris")
    imported(system, "h-b", {"HIST-A": 100}, key=system.other_key)
    wait_for(lambda: len(get(system, "/api/shipments")[1]["items"]) == 3
             and len(get(system, "/api/shipments", key=system.other_key)[1]["items"]) == 1, 30, 0.1, message="exported")

    # the owner's shipments, newest first, paged, filtered by location and time
    status, page = get(system, "/api/shipments")
    assert status == 200 and [s["batchId"] for s in page["items"]] == ["h-3", "h-2", "h-1"]
    assert page["items"][0]["location"] == "paris" and page["items"][0]["result"] == {"imported": 1, "batchId": "h-3"}
    assert page["items"][1] == get(system, "/api/shipments/h-2")[1]  # the same as the one-shipment read
    first = get(system, "/api/shipments?limit=2")[1]
    assert [s["batchId"] for s in first["items"]] == ["h-3", "h-2"] and first["nextCursor"]
    rest = get(system, f"/api/shipments?limit=2&cursor={first['nextCursor']}")[1]
    assert [s["batchId"] for s in rest["items"]] == ["h-1"] and rest["nextCursor"] is None
    assert [s["batchId"] for s in get(system, "/api/shipments?location=paris")[1]["items"]] == ["h-3"]
    to = quote(time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(between / 1000)) + f".{between % 1000:03d}Z")
    assert [s["batchId"] for s in get(system, f"/api/shipments?to={to}")[1]["items"]] == ["h-2", "h-1"]
    assert [s["batchId"] for s in get(system, f"/api/shipments?from={to}")[1]["items"]] == ["h-3"]
    assert [s["batchId"] for s in get(system, "/api/shipments", key=system.other_key)[1]["items"]] == ["h-b"]

    # movements: a producer sees its own, a stock reader everyone's
    own = get(system, "/api/stock-movements?sku=HIST-A&location=main")[1]["items"]
    assert [(m["batchId"], m["before"], m["quantity"], m["after"]) for m in own] == [("h-2", 10, 5, 15), ("h-1", 0, 10, 10)]
    everyone = get(system, "/api/stock-movements?sku=HIST-A&location=main", key=reader)[1]["items"]
    assert [(m["batchId"], m["owner"], m["after"]) for m in everyone] == [
        ("h-b", "owner-b", 115), ("h-2", "owner-a", 15), ("h-1", "owner-a", 10)]
    assert [m["sku"] for m in get(system, "/api/stock-movements?batchId=h-1")[1]["items"]] == ["HIST-B", "HIST-A"]
    status, csv = get(system, "/api/stock-movements?sku=HIST-A", accept="text/csv")
    lines = csv.splitlines()
    assert status == 200 and lines[0] == "location,batchId,line,sku,before,quantity,after,appliedAt,owner"
    assert [line.split(",")[1] for line in lines[1:]] == ["h-3", "h-2", "h-1"]

    # with no SKU or batch (newest shipments first, then their lines), page after page
    def every_page(path: str, key: str | None = None) -> list[tuple[str, int, str]]:
        items, cursor = [], None
        while True:
            page = get(system, path + (f"&cursor={cursor}" if cursor else ""), key=key)[1]
            items += [(m["batchId"], m["line"], m["sku"]) for m in page["items"]]
            if not (cursor := page["nextCursor"]):
                return items
    assert every_page("/api/stock-movements?limit=1") == [
        ("h-3", 1, "HIST-A"), ("h-2", 1, "HIST-A"), ("h-1", 2, "HIST-B"), ("h-1", 1, "HIST-A")]
    assert every_page("/api/stock-movements?limit=2", key=reader) == [
        ("h-b", 1, "HIST-A"), ("h-3", 1, "HIST-A"), ("h-2", 1, "HIST-A"), ("h-1", 2, "HIST-B"), ("h-1", 1, "HIST-A")]
    assert [m["batchId"] for m in get(system, "/api/stock-movements?location=paris")[1]["items"]] == ["h-3"]
    assert [m["batchId"] for m in get(system, f"/api/stock-movements?to={to}")[1]["items"]] == ["h-2", "h-1", "h-1"]
    status, csv = get(system, "/api/stock-movements", key=reader, accept="text/csv")
    assert [line.split(",")[1] for line in csv.splitlines()[1:]] == ["h-b", "h-3", "h-2", "h-1", "h-1"]

    # stock: only with stock:read; now from the store, as of a time from the ledger
    status, problem = get(system, "/api/stock")
    assert status == 403 and problem["code"] == "auth.scope_required"
    assert get(system, "/api/stock/HIST-A")[0] == 403
    status, stock = get(system, "/api/stock?location=main", key=reader)
    assert status == 200 and {i["sku"]: i["units"] for i in stock["items"]} == {"HIST-A": 115, "HIST-B": 1}
    assert get(system, "/api/stock/HIST-A?location=main", key=reader)[1]["units"] == 115
    assert get(system, f"/api/stock/HIST-A?location=main&asOf={to}", key=reader)[1]["units"] == 15
    as_of = get(system, f"/api/stock?location=main&asOf={to}", key=reader)[1]
    assert {i["sku"]: i["units"] for i in as_of["items"]} == {"HIST-A": 15, "HIST-B": 1}
    assert get(system, "/api/stock/NEVER-SEEN?location=paris", key=reader)[1]["units"] == 0


def test_bad_filters_are_422_with_the_field_named(history_system: tuple[System, str]) -> None:
    system, reader = history_system
    for path, field in [
        ("/api/shipments?from=yesterday", "from"), ("/api/shipments?limit=0", "limit"),
        ("/api/shipments?cursor=bogus", "cursor"), ("/api/stock-movements?sku=%2Cbad", "sku"),
        ("/api/stock-movements?batchId=%20", "batchId"),
    ]:
        status, problem = get(system, path)
        assert status == 422 and problem["code"] == "request.invalid" and field in problem["fields"], (path, problem)
    status, problem = get(system, "/api/stock?asOf=2026-13-01", key=reader)
    assert status == 422 and "asOf" in problem["fields"]
