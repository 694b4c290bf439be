"""[ops] The operators' API through the real processes (`importer serve`,
`importer worker`): a key with the ops scope sees every location's queue and
the live workers, retries a location's failed imports of one code in bulk
after a simulated outage (each as its owner, applied once), pauses and resumes
intake, reads any import's diagnostic; a producer's key gets 403 everywhere."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from importer.handlers import ops
from importer.handlers.auth import hash_key, new_key
from tests.integration.support import FIXTURES, System, wait_for

pytestmark = pytest.mark.integration

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()
SEED_SKUS = {"WIDGET-RED-01": 10, "GADGET-BLU-02": 25, "SPROCKET-07": 5}


@pytest.fixture
def ops_system(make_system: Any) -> tuple[System, str]:
    operator = new_key()
    system: System = make_system()
    system.env_overrides["IMPORTER_API_KEYS"] = (
        f"owner-a:{hash_key(system.api_key)},owner-b:{hash_key(system.other_key)},"
        f"night-shift:{hash_key(operator)} scopes=ops"
    )
    system.start_http()
    return system, operator


def call(system: System, method: str, path: str, key: str, payload: Any = None) -> tuple[int, dict[str, str], Any]:
    body = json.dumps(payload).encode() if payload is not None else None
    status, headers, raw = system.request(method, path, body=body, ctype="application/json" if body else "", key=key)
    return status, headers, json.loads(raw) if raw else None


def post(system: System, batch: str, location: str = "main", key: str | None = None) -> tuple[int, Any]:
    status, _, raw = system.request("POST", f"/api/imports?batchId={batch}&location={location}", body=SEED,
                                    ctype="text/csv", key=key or system.api_key)
    return status, json.loads(raw)


def location_row(overview: dict[str, Any], location: str) -> dict[str, Any]:
    return next(row for row in overview["locations"] if row["location"] == location)


def test_a_producer_key_gets_403_on_every_operator_route(ops_system: tuple[System, str]) -> None:
    system, _ = ops_system
    for spec in ops.ROUTE_SPECS:
        path = re.sub(r"\{\w+\}", "shipment-x", spec["template"])
        status, _, problem = call(system, spec["method"], path, system.api_key, {} if spec["method"] == "POST" else None)
        assert (status, problem["code"]) == (403, "auth.scope_required"), path
        assert "ops scope" in problem["detail"]
        assert call(system, spec["method"], path, "")[0] == 401


def test_operators_see_the_queue_retry_an_outage_in_bulk_and_act_on_record(ops_system: tuple[System, str]) -> None:
    system, operator = ops_system
    # Three imports at main (two owners), one at paris, while no worker runs.
    assert post(system, "ops-1")[0] == post(system, "ops-2")[0] == 202
    assert post(system, "ops-3", key=system.other_key)[0] == post(system, "ops-p", "paris")[0] == 202
    status, headers, view = call(system, "GET", "/api/ops/overview", operator)
    assert status == 200 and headers["Cache-Control"] == "no-store"
    main = location_row(view, "main")
    assert (main["waiting"], main["active"], main["retrying"], main["intakePaused"]) == (3, 0, 0, False)
    assert main["oldestWaitingAgeSeconds"] > 0 and location_row(view, "paris")["waiting"] == 1
    assert view["workers"] == [] and view["ledgerUp"] is None and view["intake"] == []
    first = call(system, "GET", "/api/ops/overview?limit=2", operator)[2]
    assert [r["location"] for r in first["locations"]] == ["berlin", "berlin-2"] and first["nextCursor"]
    rest = call(system, "GET", f"/api/ops/overview?limit=2&cursor={first['nextCursor']}", operator)[2]
    assert [r["location"] for r in rest["locations"]] == ["lyon", "main"]

    # The outage: a worker that reads only contract version 2 fails them all (a retryable code).
    odd = system.start_worker(IMPORTER_ACCEPTED_VERSIONS="2")
    for job in ("shipment-ops-1", "shipment-ops-2", "shipment-ops-3", "shipment-ops-p@paris"):
        assert system.wait_state(job, ("failed",), **({"key": system.other_key} if job.endswith("3") else {}))
    # A job's record is final before its message leaves the worker's count of those in
    # flight (dramatiq's after-hook), and the view shows the last beat (every second here).
    wait_for(lambda: [w["inFlight"] for w in call(system, "GET", "/api/ops/overview", operator)[2]["workers"]] == [0],
             5, message="the worker's next beat: nothing in flight")
    view = call(system, "GET", "/api/ops/overview", operator)[2]
    (worker,) = view["workers"]
    assert worker["acceptedVersions"] == [2] and worker["release"] and worker["inFlight"] == 0
    assert 0 <= worker["lastBeatAgeSeconds"] < 3
    main = location_row(view, "main")
    assert main["failures"] == {"lastHour": {"contract.unsupported_version": 3}, "lastDay": {"contract.unsupported_version": 3}}
    assert (main["waiting"], main["failedKept"]) == (0, 3)
    failed = call(system, "GET", "/api/ops/failed?location=main&errorCode=contract.unsupported_version", operator)[2]
    assert sorted((f["jobId"], f["owner"]) for f in failed["items"]) == [
        ("shipment-ops-1", "owner-a"), ("shipment-ops-2", "owner-a"), ("shipment-ops-3", "owner-b")]
    odd.stop()

    # Any import's diagnostic, whoever's; a code a retry cannot change is refused before anything.
    status, _, diag = call(system, "GET", "/api/ops/imports/shipment-ops-3", operator)
    assert status == 200 and diag["owner"] == "owner-b" and diag["diagnostic"] and diag["record"]["state"] == "failed"
    assert call(system, "GET", "/api/ops/imports/shipment-ops-3@atlantis", operator)[0] == 404
    status, _, problem = call(system, "POST", "/api/ops/retry-failed", operator, {"location": "main", "errorCode": "csv.bad_sku"})
    assert status == 422 and "errorCode" in problem["fields"]
    assert call(system, "POST", "/api/ops/retry-failed", operator, {"location": "atlantis", "errorCode": "import.stalled"})[0] == 422

    # The bulk retry, in two calls of two: main's three, each as its owner; paris's stays failed.
    system.start_worker()
    status, _, done = call(system, "POST", "/api/ops/retry-failed", operator,
                           {"location": "main", "errorCode": "contract.unsupported_version", "limit": 2})
    assert status == 200 and len(done["retried"]) == 2 and done["more"] is True and done["skipped"] == {}
    done2 = call(system, "POST", "/api/ops/retry-failed", operator,
                 {"location": "main", "errorCode": "contract.unsupported_version"})[2]
    assert len(done2["retried"]) == 1 and done2["more"] is False
    assert sorted(done["retried"] + done2["retried"]) == ["shipment-ops-1", "shipment-ops-2", "shipment-ops-3"]
    for job, key in (("shipment-ops-1", system.api_key), ("shipment-ops-2", system.api_key), ("shipment-ops-3", system.other_key)):
        record = system.wait_state(job, ("completed",), key=key)
        assert record["retries"] == 1
    assert system.get_job("shipment-ops-p@paris")[1]["state"] == "failed"
    # Three shipments of SEED applied, each once.
    assert system.store().stock_of(list(SEED_SKUS)) == {sku: 3 * n for sku, n in SEED_SKUS.items()}
    assert system.store().generation() == 3

    # Recorded, with who and when.
    actions = call(system, "GET", "/api/ops/actions", operator)[2]["items"]
    assert [(a["action"], a["by"], a["detail"]["retried"]) for a in actions] == [
        ("retry-failed", "night-shift", 1), ("retry-failed", "night-shift", 2)]
    assert actions[0]["at"].endswith("Z") or "+00:00" in actions[0]["at"]


def test_paused_intake_refuses_new_uploads_with_retry_after_and_health_says_so(ops_system: tuple[System, str]) -> None:
    system, operator = ops_system
    system.start_worker()
    status, _, answer = call(system, "POST", "/api/ops/intake", operator, {"paused": True, "location": "paris"})
    assert status == 200 and [(p["location"], p["by"]) for p in answer["intake"]] == [("paris", "night-shift")]
    status, paused = post(system, "in-1", "paris")
    assert (status, paused["code"]) == (503, "intake.paused")
    assert system.get_job("shipment-in-1@paris")[0] == 404  # nothing recorded
    assert post(system, "in-2")[0] == 202  # main still takes shipments

    # Everywhere: main refuses too, with Retry-After; /health stays 200 and says so.
    call(system, "POST", "/api/ops/intake", operator, {"paused": True})
    status, headers, raw = system.request("POST", "/api/imports?batchId=in-3", body=SEED, ctype="text/csv")
    assert status == 503 and json.loads(raw)["code"] == "intake.paused" and int(headers["Retry-After"]) > 0
    status, _, health = system.request("GET", "/health", key=None)
    assert status == 200 and json.loads(health)["intake"] == {"paused": True, "locations": ["*", "paris"]}
    assert location_row(call(system, "GET", "/api/ops/overview", operator)[2], "main")["intakePaused"] is True
    # Reads and the event stream go on.
    assert system.wait_state("shipment-in-2", ("completed",))["state"] == "completed"

    # Resumed everywhere: the same POSTs are taken now.
    assert call(system, "POST", "/api/ops/intake", operator, {"paused": False})[2]["intake"] == []
    assert post(system, "in-1", "paris")[0] == post(system, "in-3")[0] == 202
    assert json.loads(system.request("GET", "/health", key=None)[2])["intake"] == {"paused": False, "locations": []}
    wait_for(lambda: system.get_job("shipment-in-1@paris")[1]["state"] == "completed", 30, message="paris import")
    actions = call(system, "GET", "/api/ops/actions?limit=2", operator)[2]
    assert [(a["detail"]["location"], a["detail"]["paused"]) for a in actions["items"]] == [("*", False), ("*", True)]
    older = call(system, "GET", f"/api/ops/actions?cursor={actions['nextCursor']}", operator)[2]["items"]
    assert [(a["detail"]["location"], a["detail"]["paused"]) for a in older] == [("paris", True)]
