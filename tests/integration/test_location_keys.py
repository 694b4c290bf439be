"""A key restricted to stock locations, from the producer's side: a real
HTTP server process, a real worker and Redis. At a location its key does not
allow, a producer sees what it would see if nothing were there."""

from __future__ import annotations

import json
from typing import Any

import pytest

from importer.handlers.auth import hash_key, new_key
from tests.integration.support import FIXTURES, System

pytestmark = pytest.mark.integration

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()
BAD = (FIXTURES / "invalid-bad-quantity.csv").read_bytes()


@pytest.fixture
def keyed(make_system: Any) -> tuple[System, str]:
    """owner-a's key for every location (system.api_key), and one for paris and lyon only."""
    system: System = make_system()
    paris_key = new_key()
    system.env_overrides["IMPORTER_API_KEYS"] = (
        f"owner-a:{hash_key(system.api_key)},owner-b:{hash_key(system.other_key)},"
        f"owner-a:{hash_key(paris_key)} locations=paris|lyon"
    )
    system.start_worker()
    system.start_http()
    return system, paris_key


def post(system: System, batch_id: str, data: bytes, key: str, location: str | None = None, *, as_json: bool = False) -> tuple[int, Any]:
    if as_json:
        payload: dict[str, str] = {"batchId": batch_id, "csv": data.decode()}
        if location is not None:
            payload["location"] = location
        status, _, raw = system.request("POST", "/api/imports", body=json.dumps(payload).encode(), ctype="application/json", key=key)
    else:
        query = f"&location={location}" if location is not None else ""
        status, _, raw = system.request("POST", f"/api/imports?batchId={batch_id}{query}", body=data, ctype="text/csv", key=key)
    return status, json.loads(raw)


def answer(system: System, method: str, path: str, key: str) -> tuple[int, bytes]:
    status, _, body = system.request(method, path, key=key)
    return status, body


def test_a_key_for_some_locations_sees_nothing_elsewhere(keyed: tuple[System, str]) -> None:
    system, paris = keyed
    full = system.api_key
    # With the key for every location: the same batch at main, paris and berlin, and a failed one at main.
    for location in (None, "paris", "berlin"):
        assert post(system, "acc-1", SEED, full, location)[0] == 202
    assert post(system, "acc-bad", BAD, full)[0] == 202
    for job_id in ("shipment-acc-1", "shipment-acc-1@paris", "shipment-acc-1@berlin", "shipment-acc-bad"):
        assert system.wait_state(job_id)["state"] in ("completed", "failed")

    # Uploads: another location, or none named while the default (main) is not the key's: refused, nothing recorded.
    for location, as_json in ((None, False), (None, True), ("main", False), ("berlin", True)):
        status, problem = post(system, "acc-2", SEED, paris, location, as_json=as_json)
        assert (status, problem["code"]) == (404, "location.not_found"), problem
    assert system.get_job("shipment-acc-2")[0] == 404
    assert system.get_job("shipment-acc-2@berlin")[0] == 404
    # Its own locations work as before.
    status, accepted = post(system, "acc-2", SEED, paris, "lyon", as_json=True)
    assert status == 202 and accepted["jobId"] == "shipment-acc-2@lyon"
    assert system.wait_state("shipment-acc-2@lyon")["state"] == "completed"
    assert answer(system, "GET", "/api/imports/shipment-acc-1@paris", paris)[0] == 200
    assert answer(system, "GET", "/api/shipments/acc-1/receipt?location=paris", paris)[0] == 200

    # Reads at another location: the same bytes as something that does not exist.
    same_as_missing = [
        ("GET", "/api/imports/shipment-acc-1", "/api/imports/shipment-never"),
        ("GET", "/api/imports/shipment-acc-1@berlin", "/api/imports/shipment-never@paris"),
        ("GET", "/api/imports/shipment-acc-1/events", "/api/imports/shipment-never/events"),
        ("GET", "/api/imports/shipment-acc-bad/rejections.csv", "/api/imports/shipment-never/rejections.csv"),
        ("POST", "/api/imports/shipment-acc-bad/retry", "/api/imports/shipment-never/retry"),
        ("GET", "/api/shipments/acc-1", "/api/shipments/never"),
        ("GET", "/api/shipments/acc-1?location=berlin", "/api/shipments/never?location=paris"),
        ("GET", "/api/shipments/acc-1/receipt", "/api/shipments/never/receipt"),
        ("GET", "/api/shipments/acc-1/receipt?location=berlin", "/api/shipments/never/receipt?location=lyon"),
        ("GET", "/api/imports?location=berlin", "/api/imports?location=nowhere"),
        ("GET", "/api/imports?location=main&state=failed", "/api/imports?location=nowhere&state=failed"),
    ]
    for method, hidden, missing in same_as_missing:
        seen = answer(system, method, hidden, paris)
        assert seen == answer(system, method, missing, paris), hidden
        assert seen[0] in (200, 404), seen
    # The list without ?location=: the key's locations only.
    status, raw = answer(system, "GET", "/api/imports", paris)
    assert status == 200
    assert sorted(item["id"] for item in json.loads(raw)["items"]) == ["shipment-acc-1@paris", "shipment-acc-2@lyon"]

    # The key for every location still sees everything, and the failed import was not retried.
    status, raw = answer(system, "GET", "/api/imports?limit=100", full)
    assert status == 200 and len(json.loads(raw)["items"]) == 5
    assert system.get_job("shipment-acc-bad")[1]["retries"] == 0
    assert answer(system, "GET", "/api/shipments/acc-1?location=berlin", full)[0] == 200
