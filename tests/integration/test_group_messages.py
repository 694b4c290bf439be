"""Group messages (contract version 3) through the real processes: a bulk
request's small shipments of one location travel as one dramatiq message per
64, the worker runs them in one call each with its own outcome; a large one,
and every shipment while a live worker does not read groups, get a message of
their own; the same body again sends nothing."""

from __future__ import annotations

import json
import signal
import time
import uuid
from typing import Any

import pytest
import redis

from importer.adapters.dramatiq.middleware import Reconciler
from importer.adapters.dramatiq.producer import ImportQueue
from importer.domain.shipment import job_id_for
from tests.integration.support import System, wait_for
from tests.integration.test_bulk import bulk, line

pytestmark = pytest.mark.integration


def messages_in_queue(system: System) -> list[dict[str, Any]]:
    """The bodies of the import messages the broker holds (Redis transport)."""
    client = redis.Redis.from_url(system.redis_url)
    stored = client.hvals(f"{system.prefix}dramatiq:{system.queue_name}.msgs")
    return [json.loads(raw)["args"][0] for raw in stored]


def shipments() -> list[Any]:
    """151 small shipments at main (one with a bad quantity), 50 at paris, one over the one-step bound."""
    items: list[Any] = [line(f"g-{i}", {f"G-{i % 5}": 1, "G-ALL": 2}) for i in range(150)]
    items.append({"batchId": "g-bad", "csv": "sku,quantity\nG-0,-4\n"})
    items += [line(f"p-{i}", {"P-1": 3}, "paris") for i in range(50)]
    items.append(line("g-large", {f"L-{n:05d}": 1 for n in range(2000)}))  # about 20 KiB
    return items


def test_a_bulk_travels_as_group_messages_and_each_import_ends_on_its_own(make_system: Any) -> None:
    system: System = make_system(IMPORTER_RATE_LIMIT="0", IMPORTER_KEEP_COMPLETED_COUNT="1000")
    system.start_http()
    status, answer = bulk(system, shipments())
    assert status == 200
    assert [r["status"] for r in answer["results"]] == [202] * 202

    # No worker alive: the door is open to groups, as to any new work.
    bodies = messages_in_queue(system)
    groups = [b for b in bodies if b["version"] == 3]
    singles = [b for b in bodies if b["version"] != 3]
    assert sorted(len(g["jobs"]) for g in groups) == [23, 50, 64, 64]
    assert [s["jobId"] for s in singles] == ["shipment-g-large"]
    carried = [j["jobId"] for g in groups for j in g["jobs"]]
    assert len(carried) == len(set(carried)) == 201
    assert {j.split("@")[1] if "@" in j else "main" for g in groups for j in [g["jobs"][0]["jobId"]]} == {"main", "paris"}

    system.start_worker()
    for i in range(150):
        assert system.wait_state(f"shipment-g-{i}")["state"] == "completed"
    for i in range(50):
        assert system.wait_state(f"shipment-p-{i}@paris")["state"] == "completed"
    bad = system.wait_state("shipment-g-bad")
    assert bad["state"] == "failed" and bad["error"]["code"] == "csv.bad_quantity" and bad["attempt"] == 1
    large = system.wait_state("shipment-g-large")
    assert large["state"] == "completed"

    store = system.store()
    assert store.stock_of([f"G-{n}" for n in range(5)] + ["G-ALL"]) == {**{f"G-{n}": 30 for n in range(5)}, "G-ALL": 300}
    assert store.stock_of(["P-1"], "paris") == {"P-1": 150}
    assert store.stock_of(["L-00000", "L-01999"]) == {"L-00000": 1, "L-01999": 1}
    assert store.generation() == 151 and store.generation("paris") == 50
    # Each import had one attempt of its own, and every message was acknowledged.
    for job in ("shipment-g-0", "shipment-g-149", "shipment-p-49@paris"):
        status, record = system.get_job(job)
        assert record["attempt"] == 1 and not record["result"].get("replay"), record
    wait_for(lambda: messages_in_queue(system) == [], 10, message="every message acknowledged")

    # The same body again: every shipment answers its job, nothing is sent or applied again.
    status, again = bulk(system, shipments())
    assert [(r["status"], r["body"]["jobId"]) for r in again["results"]] == [
        (r["status"], r["body"]["jobId"]) for r in answer["results"]]
    assert messages_in_queue(system) == []
    assert store.generation() == 151 and store.generation("paris") == 50


def test_while_a_live_worker_does_not_read_groups_each_shipment_gets_its_own_message(make_system: Any) -> None:
    system: System = make_system(IMPORTER_RATE_LIMIT="0", IMPORTER_KEEP_COMPLETED_COUNT="1000")
    system.start_http()
    old = system.start_worker(IMPORTER_ACCEPTED_VERSIONS="1")

    def announced() -> bool:
        status, _, body = system.request("GET", "/health")
        return status == 200 and bool(json.loads(body).get("workers"))

    wait_for(announced, 20, message="the v1-only worker announced itself")
    old.signal(signal.SIGSTOP)  # alive at the door (its presence has not expired), fetching nothing
    try:
        status, answer = bulk(system, [line(f"v1-{i}", {"V1-A": 1}) for i in range(10)])
        assert [r["status"] for r in answer["results"]] == [202] * 10
        bodies = messages_in_queue(system)
        assert sorted(b["jobId"] for b in bodies) == sorted(f"shipment-v1-{i}" for i in range(10))
        assert {b["version"] for b in bodies} == {1}
    finally:
        old.signal(signal.SIGCONT)
    for i in range(10):
        assert system.wait_state(f"shipment-v1-{i}")["state"] == "completed"
    assert system.store().stock_of(["V1-A"]) == {"V1-A": 10}


def test_a_worker_sigkilled_with_group_messages_in_flight_loses_nothing_and_applies_nothing_twice(make_system: Any) -> None:
    system: System = make_system(IMPORTER_RATE_LIMIT="0", IMPORTER_KEEP_COMPLETED_COUNT="1000")
    system.start_http()
    count = 640  # ten groups of 64
    status, answer = bulk(system, [line(f"k-{i}", {"K-A": 1, f"K-{i % 7}": 2}) for i in range(count)])
    assert [r["status"] for r in answer["results"]] == [202] * count
    store = system.store()
    # One import per script call: a group takes long enough to be caught in the middle.
    doomed = system.start_worker(IMPORTER_APPLY_TOGETHER_MAX="1")
    wait_for(lambda: store.generation() >= 20, 30, 0.002, message="the first imports applied")
    doomed.kill()
    at_kill = store.generation()
    assert at_kill < count, "every import was applied before the kill: the scenario tested nothing"
    system.start_worker()
    wait_for(lambda: store.generation() >= count, 60, message="every import applied")
    for i in range(count):
        assert system.wait_state(f"shipment-k-{i}")["state"] == "completed"
    assert store.generation() == count
    assert store.stock_of(["K-A"]) == {"K-A": count}
    assert store.stock_of([f"K-{n}" for n in range(7)]) == {f"K-{n}": 2 * len(range(n, count, 7)) for n in range(7)}


def test_the_reconciler_resends_due_jobs_as_group_messages(make_system: Any) -> None:
    """Jobs recorded whose messages were never sent (a producer that died
    between the two): the reconciler's pass sends them as group messages per
    location while every live worker reads groups; a worker then runs each once."""
    system: System = make_system(IMPORTER_RATE_LIMIT="0", IMPORTER_WAITING_GRACE="0.2")
    system.start_http()  # declares the locations
    store = system.store()
    jobs = [(f"rs-{i}", "main") for i in range(70)] + [(f"rs-p-{i}", "paris") for i in range(3)]
    for batch, location in jobs:
        job_id = job_id_for(batch, location)
        outcome = store.enqueue(job_id=job_id, batch_id=batch, owner="owner-a", content_sha256="",
                                upload_id=uuid.uuid4().hex, csv=b"sku,quantity\nRS-1,1\n", send_later=True)
        assert outcome.kind == "created" and not outcome.sent
    assert messages_in_queue(system) == []
    time.sleep(0.3)  # past the waiting grace: due
    reconciler = Reconciler(store, runner=None, settings=system.settings)  # type: ignore[arg-type]
    reconciler.broker = system.queue().broker
    reconciler.queue = ImportQueue(reconciler.broker, system.settings)
    assert reconciler.reconcile_once() == len(jobs)
    bodies = messages_in_queue(system)
    if system.transport == "redis":
        assert sorted(len(b["jobs"]) for b in bodies) == [3, 6, 64] and {b["version"] for b in bodies} == {3}
    system.start_worker()
    for batch, location in jobs:
        record = system.wait_state(job_id_for(batch, location))
        assert (record["state"], record["attempt"]) == ("completed", 1), record
    assert store.stock_of(["RS-1"]) == {"RS-1": 70} and store.stock_of(["RS-1"], "paris") == {"RS-1": 3}
