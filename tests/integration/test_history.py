"""The stock history read from the ledger, through the real processes
(`importer serve`, `importer worker`, `importer ledger`, a real PostgreSQL):
the owner's applied shipments, stock movements (pages and CSV), and stock
levels now and as of a time for keys with the stock:read scope."""

from __future__ import annotations

import json
import socket
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


def start_history_system(make_system: Any, make_database: Any, more_keys: str = "") -> tuple[System, str]:
    """The real processes with a ledger, owner-a's and owner-b's keys, a stock:read key
    (returned), and ``more_keys`` (IMPORTER_API_KEYS entries)."""
    reader = new_key()
    system = make_system(IMPORTER_DATABASE_URL=make_database(), IMPORTER_LEDGER_INTERVAL="0.05")
    system.env_overrides["IMPORTER_API_KEYS"] = (
        f"owner-a:{hash_key(system.api_key)},owner-b:{hash_key(system.other_key)},"
        f"stock-desk:{hash_key(reader)} scopes=stock:read" + (f",{more_keys}" if more_keys else "")
    )
    system.start_worker()
    system.start_http()
    system.start_ledger()
    return system, reader


@pytest.fixture
def history_system(make_system: Any, make_database: Any) -> tuple[System, str]:
    return start_history_system(make_system, make_database)


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


def _stalled_download(system: System, key: str) -> tuple[socket.socket, int, bytes]:
    """GET the movements as CSV on a raw socket, read about 64 KiB, then stop reading
    (the socket stays open): (the socket, the status, the bytes read)."""
    host, port = system.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.sendall(f"GET /api/stock-movements HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
                 "Accept: text/csv\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data or len(data) < 64 * 1024:
        chunk = sock.recv(16 * 1024)
        if not chunk:
            break
        data += chunk
        if data.startswith(b"HTTP/1.1 429") and b"\r\n\r\n" in data:
            break
    return sock, int(data.split(b" ", 2)[1]), data


@pytest.mark.parametrize("bounds", [{}, {"IMPORTER_MAX_DOWNLOADS": "12", "IMPORTER_MAX_DOWNLOADS_PER_OWNER": "12"}],
                         ids=["default-bounds", "no-bound-hit"])
def test_stalled_csv_downloads_hold_no_connection_and_another_owner_reads_on(
    make_system: Any, make_database: Any, bounds: dict[str, str],
) -> None:
    """One producer's 100,000-row shipment, then 12 CSV downloads of its movements that read
    64 KiB and stop: past the bounds (1 per owner per process, 2 in all) they get 429 with
    Retry-After; the ones served hold no database connection while they wait, so another
    owner's reads of shipments and movements answer 200 throughout (they waited 5 s for a
    connection and got 503 when each stalled download held one in a transaction); with the
    bounds raised so that all 12 are served and stalled, too. A download whose client
    takes nothing past IMPORTER_DOWNLOAD_STALL ends, cut."""
    system = make_system(IMPORTER_DATABASE_URL=make_database(), IMPORTER_LEDGER_INTERVAL="0.05",
                         IMPORTER_DOWNLOAD_STALL="2", **bounds)
    system.start_worker()
    system.start_http(workers=2)
    system.start_ledger()
    big = "sku,quantity\n" + "".join(f"STALL-{i:06d},1\n" for i in range(100_000))
    status, _, raw = system.request("POST", "/api/imports?batchId=stall-big", body=big.encode(), ctype="text/csv")
    assert status == 202, raw
    assert system.wait_state(job_id_for("stall-big"), timeout=120)["state"] == "completed"
    imported(system, "stall-b", {"STALL-B": 2}, key=system.other_key)
    wait_for(lambda: get(system, "/api/shipments")[1]["items"] and get(system, "/api/shipments", key=system.other_key)[1]["items"],
             120, 0.2, message="exported")

    stalled = [_stalled_download(system, system.api_key) for _ in range(12)]
    try:
        served = [s for s in stalled if s[1] == 200]
        refused = [s for s in stalled if s[1] == 429]
        most = 12 if bounds else 2  # one per owner in each of the 2 processes
        assert len(served) + len(refused) == 12 and 1 <= len(served) <= most and (bounds or refused), [s[1] for s in stalled]
        assert all(b"retry-after: 5" in s[2].lower() and b"request.rate_limited" in s[2] for s in refused), refused[0][2][:600]
        answers = []
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            for path in ("/api/shipments", "/api/stock-movements?limit=100", "/api/shipments/stall-b"):
                answers.append(get(system, path, key=system.other_key)[0])
        assert answers and set(answers) == {200}, {s: answers.count(s) for s in set(answers)}
        # Past the stall bound a download ends cut (no closing chunk) and frees its slot. (A server
        # may also take a whole download into its own buffers before the client stalls it: then
        # it holds no thread either, and ends whole.)
        cut = []
        for sock, _, _ in served:
            sock.settimeout(30)
            rest = b""
            while chunk := sock.recv(1 << 20):
                rest += chunk
            cut.append(not rest.endswith(b"0\r\n\r\n"))
        assert any(cut), "no stalled download was cut"
        def served_again() -> bool:
            sock, status, _ = _stalled_download(system, system.api_key)
            sock.close()
            return status == 200
        wait_for(served_again, 30, 0.5, message="a slot free again")
    finally:
        for sock, _, _ in stalled:
            sock.close()
