"""The same app behind a second WSGI server (waitress, pure Python), with real
workers on both message transports: the design card's "any WSGI server"."""

from __future__ import annotations

import json
import socket

import pytest

from tests.integration.support import FIXTURES, System

pytestmark = pytest.mark.integration

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()


@pytest.fixture(params=["redis", "rabbitmq"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def waitress_system(make_system: object) -> System:
    system = make_system()  # type: ignore[operator]
    system.start_worker()
    system.start_http(server="waitress")
    return system


def test_the_seed_scenario_under_waitress(waitress_system: System) -> None:
    s = waitress_system
    status, headers, body = s.request("POST", "/api/imports?batchId=shipment-a-2026", body=SEED, ctype="text/csv")
    assert status == 202 and headers["Location"] == "/api/imports/shipment-shipment-a-2026"
    assert s.post_csv("shipment-a-2026", SEED)[1]["jobId"] == "shipment-shipment-a-2026"  # same job again
    record = s.wait_state("shipment-shipment-a-2026")
    assert {k: record[k] for k in ("id", "state", "progress", "result", "error")} == {
        "id": "shipment-shipment-a-2026", "state": "completed", "progress": {"phase": "committed", "rows": 3},
        "result": {"imported": 3, "batchId": "shipment-a-2026"}, "error": None,
    }
    assert s.store().generation() == 1

    s.post_csv("bad-1", (FIXTURES / "invalid-bad-quantity.csv").read_bytes())
    failed = s.wait_state("shipment-bad-1")
    assert failed["error"]["code"] == "csv.bad_quantity" and failed["error"]["issues"]

    assert s.request("GET", "/api/imports/shipment-shipment-a-2026", key=None)[0] == 401
    assert s.request("GET", "/api/imports/shipment-shipment-a-2026", key=s.other_key)[0] == 404
    assert s.request("GET", "/api/shipments/shipment-a-2026")[0] == 200
    status, _, body = s.request("GET", "/health", key=None)
    assert (status, json.loads(body)["status"], json.loads(body)["workers"]["acceptsImports"]) == (200, "ok", True)

    port = int(s.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"POST /api/imports?batchId=huge HTTP/1.1\r\nHost: x\r\nContent-Type: text/csv\r\n"
            + f"Authorization: Bearer {s.api_key}\r\nContent-Length: {1024 ** 3}\r\n\r\n".encode()
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 413")
