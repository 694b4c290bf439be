"""Stock locations over real HTTP, real workers and a real Redis: one
shipment per (location, batchId), each location its own partition (its own
hash tag), every read routed to exactly one of them."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from importer.adapters.redis.keys import Keys
from importer.domain.locations import MAIN
from tests.integration.support import FIXTURES, ROOT, System

pytestmark = pytest.mark.integration

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()
SEED_SKUS = {"WIDGET-RED-01": 10, "GADGET-BLU-02": 25, "SPROCKET-07": 5}
LOCATIONS = ("main", "paris", "berlin-2")


@pytest.fixture(params=["redis", "rabbitmq"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _post(system: System, batch_id: str, location: str | None, *, json_body: bool = False) -> tuple[int, Any]:
    if json_body:
        body: dict[str, str] = {"batchId": batch_id, "csv": SEED.decode()}
        if location is not None:
            body["location"] = location
        status, _, raw = system.request("POST", "/api/imports", body=json.dumps(body).encode(), ctype="application/json")
        return status, json.loads(raw)
    query = f"&location={location}" if location is not None else ""
    status, _, raw = system.request("POST", f"/api/imports?batchId={batch_id}{query}", body=SEED, ctype="text/csv")
    return status, json.loads(raw)


def _get(system: System, path: str, key: str | None = "default") -> tuple[int, Any]:
    status, _, raw = system.request("GET", path, key=key)
    return status, json.loads(raw)


def test_one_batch_id_at_three_locations_is_three_shipments(system: System) -> None:
    accepted = {}
    for i, location in enumerate(LOCATIONS):
        status, body = _post(system, "wh-1", None if location == MAIN else location, json_body=i % 2 == 0)
        assert status == 202, body
        assert body["location"] == location
        accepted[location] = body["jobId"]
    assert accepted == {"main": "shipment-wh-1", "paris": "shipment-wh-1@paris", "berlin-2": "shipment-wh-1@berlin-2"}

    for location, job_id in accepted.items():
        record = system.wait_state(job_id)
        assert record["state"] == "completed", record
        assert record["location"] == location
        assert record["result"] == {"imported": 3, "batchId": "wh-1"}
    store = system.store()
    for location in LOCATIONS:
        # Each location's stock, generation and done marker: in its own partition, once.
        assert store.stock_of(list(SEED_SKUS), location) == SEED_SKUS
        assert store.generation(location) == 1
        assert store.client.hlen(store.partition(location).stock) == 3
        status, shipment = _get(system, f"/api/shipments/wh-1?location={location}")
        assert status == 200 and shipment["location"] == location, shipment
        status, receipt = _get(system, f"/api/shipments/wh-1/receipt?location={location}")
        assert status == 200 and receipt["jobId"] == accepted[location], receipt
        assert [(i["sku"], i["before"], i["after"]) for i in receipt["items"]] == [
            (sku, 0, n) for sku, n in SEED_SKUS.items()
        ]
    # The partitions' hash tags differ: on a cluster they are different slots.
    tags = {store.partition(location).prefix for location in LOCATIONS}
    assert len(tags) == 3 and store.partition(MAIN).prefix == system.prefix

    # A replay at one location is a replay there only.
    status, again = _post(system, "wh-1", "paris")
    assert (status, again["jobId"], again["state"]) == (202, "shipment-wh-1@paris", "completed")
    assert store.stock_of(list(SEED_SKUS), "paris") == SEED_SKUS

    # The owner's list spans every location, newest first, and filters by one.
    status, page = _get(system, "/api/imports?limit=100")
    assert status == 200
    assert sorted(item["id"] for item in page["items"]) == sorted(accepted.values())
    status, page = _get(system, "/api/imports?location=paris")
    assert [item["id"] for item in page["items"]] == ["shipment-wh-1@paris"]
    # Paging across locations: every record once, in order.
    seen, cursor = [], ""
    while True:
        status, page = _get(system, "/api/imports?limit=1" + (f"&cursor={cursor}" if cursor else ""))
        assert status == 200
        seen += [item["id"] for item in page["items"]]
        cursor = page["nextCursor"]
        if not cursor:
            break
    assert sorted(seen) == sorted(accepted.values()) and len(seen) == 3

    # Another owner sees nothing, at any location, with the same answers as for missing ones.
    status, _ = _get(system, "/api/imports/shipment-wh-1@paris", key=system.other_key)
    assert status == 404
    status, _ = _get(system, "/api/shipments/wh-1?location=paris", key=system.other_key)
    assert status == 404
    status, page = _get(system, "/api/imports", key=system.other_key)
    assert page["items"] == []
    # A location never used, and a shipment of another location: 404.
    status, body = _get(system, "/api/shipments/wh-1?location=nowhere")
    assert (status, body["code"]) == (404, "shipment.not_found")


def test_a_bad_location_is_a_clear_422(system: System) -> None:
    for bad in ("Paris", "a@b", "x" * 33, "-lead", "{tag}"):
        status, body = _post(system, "bad-loc", bad, json_body=True)
        assert status == 422, body
        assert body["code"] == "request.invalid" and "location" in body["fields"], body
    status, _, raw = system.request("GET", "/api/shipments/wh-1?location=UP")
    assert status == 422 and "location" in json.loads(raw)["fields"]
    status, _, raw = system.request(
        "POST", "/api/imports?location=paris", body=json.dumps({"batchId": "b", "csv": SEED.decode(), "location": "rome"}).encode(),
        ctype="application/json",
    )
    assert status == 422 and "location" in json.loads(raw)["fields"]


def test_a_job_recorded_but_never_sent_at_another_location_is_sent_by_the_reconciler(make_system: Any) -> None:
    """On RabbitMQ the POST records the job, then publishes its message (two
    steps): a producer that dies between them leaves the job unsent, and the
    reconciler sends it. On dramatiq's Redis broker the message is written by
    the script that records the job, at any location (in the location's own
    partition on a cluster): there is no such window, and the fault never fires."""
    system = make_system(IMPORTER_FAULT="before_send:crash", IMPORTER_WAITING_GRACE="1")
    system.start_http()
    answered = None
    try:
        answered = _post(system, "lost-1", "paris")
    except Exception:
        pass  # the HTTP process died before answering: that is the fault
    store = system.store()
    k = store.partition("paris")
    unsent = store.client.zscore(k.unsent, "shipment-lost-1@paris")
    if system.transport == "redis":
        assert answered is not None and answered[0] == 202, answered
        assert unsent is None  # recorded and sent in one script
    else:
        assert answered is None and unsent is not None
    assert store.client.sismember(store.keys.locations, "paris")
    system.stop_all()
    system.env_overrides.pop("IMPORTER_FAULT")
    system.start_worker()
    system.start_http()
    assert system.wait_state("shipment-lost-1@paris", timeout=30)["state"] == "completed"
    assert store.stock_of(list(SEED_SKUS), "paris") == SEED_SKUS


def test_an_upgraded_install_keeps_its_keys(tmp_path: Path) -> None:
    """main's partition is the single-location install's layout, key for key:
    the previous release's keys.py (from git) names every key alike, so an
    upgraded install finds its stock, done markers, receipts and jobs as they
    are, with nothing to migrate."""
    old = subprocess.run(
        ["git", "show", "d1174f0:adapters/redis/keys.py"], cwd=ROOT, capture_output=True, check=True,
    ).stdout
    path = tmp_path / "old_keys.py"
    path.write_bytes(old)
    spec = importlib.util.spec_from_file_location("old_keys", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_keys"] = module
    spec.loader.exec_module(module)
    before, now = module.Keys("{importer}:"), Keys("{importer}:", MAIN)
    names = [n for n, v in vars(before).items() if isinstance(v, str)]
    assert len(names) >= 15
    assert {n: getattr(now, n) for n in names} == {n: getattr(before, n) for n in names}
    for method in ("job", "rejections", "upload", "done", "receipt", "owner_jobs", "job_events", "completed_of", "failed_of"):
        assert getattr(now, method)("x-1") == getattr(before, method)("x-1"), method
    assert now.rate("o", 7) == before.rate("o", 7) and now.workers_accepting(1) == before.workers_accepting(1)


def test_the_observer_follows_every_location_and_resumes_each(system: System) -> None:
    """``importer events`` reads each location's stream; a location whose
    first job comes after the observer started is picked up too."""
    import signal
    import time

    from tests.integration.support import wait_for

    out = system.workdir / "events.jsonl"
    errors = system.workdir / "events.log"
    with out.open("wb") as sink, errors.open("wb") as log:
        observer = subprocess.Popen(
            [sys.executable, "-m", "importer.adapters.processes.cli", "events", "--json"],
            env={**system.env, "IMPORTER_LOG_FORMAT": "text"}, stdout=sink, stderr=log,
        )
    try:
        # Watching ("from now") before the first job exists: a start-up slower than a
        # fixed sleep (CI under load) would begin after the events and miss them.
        wait_for(lambda: "events.watching" in errors.read_text(), 30, message="the observer watching")
        for batch, location in (("obs-a", "main"), ("obs-b", "paris"), ("obs-c", "rome")):
            assert _post(system, batch, location)[0] == 202
        for job_id in ("shipment-obs-a", "shipment-obs-b@paris", "shipment-obs-c@rome"):
            system.wait_state(job_id)

        def outcomes() -> set[str]:
            lines = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
            return {e["jobId"] for e in lines if e["event"] == "completed"}

        wait_for(lambda: len(outcomes()) == 3, 15, message="the observer saw every location's outcome")
    finally:
        observer.send_signal(signal.SIGTERM)
        assert observer.wait(timeout=10) == 0
    events = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    paris_last = [e["id"] for e in events if e["jobId"].endswith("@paris")][-1]
    # Resumed per location: paris after its last event, main and rome not named (from their beginning).
    assert _post(system, "obs-d", "paris")[0] == 202
    system.wait_state("shipment-obs-d@paris")
    out2 = system.workdir / "events2.jsonl"
    with out2.open("wb") as sink:
        again = subprocess.Popen(
            [sys.executable, "-m", "importer.adapters.processes.cli", "events", "--json", "--from", f"paris={paris_last}"],
            env={**system.env, "IMPORTER_LOG_FORMAT": "text"}, stdout=sink, stderr=subprocess.DEVNULL,
        )
    try:
        def seen() -> list[dict[str, Any]]:
            return [json.loads(x) for x in out2.read_text().splitlines() if x.strip()]

        wait_for(lambda: any(e["jobId"] == "shipment-obs-d@paris" and e["event"] == "completed" for e in seen()), 15,
                 message="the resumed observer caught up")
        time.sleep(0.5)
    finally:
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=10) == 0
    jobs = {e["jobId"] for e in seen()}
    assert "shipment-obs-b@paris" not in jobs  # paris resumed after its own last id
    assert {"shipment-obs-a", "shipment-obs-c@rome", "shipment-obs-d@paris"} <= jobs
