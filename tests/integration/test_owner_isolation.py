"""One owner cannot remove or probe another's records: retention counts per
owner, and the owner-scoped reads load nothing of another owner's record."""

from __future__ import annotations

import time

import pytest

from importer.domain.jobs import JobState
from importer.domain.shipment import job_id_for
from tests.integration.support import FIXTURES, System, wait_for

pytestmark = pytest.mark.integration

BAD = (FIXTURES / "invalid-bad-quantity.csv").read_bytes()
#: Each owner keeps its newest 3 completed and 3 failed records (ages far off).
SMALL_COUNTS = {
    "IMPORTER_KEEP_FAILED_COUNT": "3", "IMPORTER_KEEP_COMPLETED_COUNT": "3",
    "IMPORTER_KEEP_FAILED_AGE": "3600", "IMPORTER_KEEP_COMPLETED_AGE": "3600",
}


def csv_for(n: int) -> bytes:
    return f"sku,quantity\nOWN-{n},{n + 1}\n".encode()


def import_and_wait(system: System, batch: str, data: bytes, key: str) -> dict:
    assert system.post_csv(batch, data, key=key)[0] == 202
    status, record = wait_finished(system, job_id_for(batch), key)
    assert status == 200
    return record


def wait_finished(system: System, job_id: str, key: str) -> tuple[int, dict]:
    def finished() -> tuple[int, dict] | None:
        status, record = system.get_job(job_id, key=key)
        return (status, record) if status == 200 and record["state"] in ("completed", "failed") else None

    return wait_for(finished, 60, 0.05, message=f"{job_id} finished")


def test_one_owners_traffic_does_not_remove_anothers_records(make_system: object) -> None:
    system = make_system(**SMALL_COUNTS)  # type: ignore[operator]
    system.start_worker()
    system.start_http()
    a, b = system.api_key, system.other_key
    a_failed = import_and_wait(system, "a-bad-1", BAD, a)
    assert a_failed["state"] == "failed" and len(a_failed["error"]["issues"]) == 2
    assert import_and_wait(system, "a-ok-1", csv_for(0), a)["state"] == "completed"

    b_failed = [f"b-bad-{n}" for n in range(7)]
    b_done = [f"b-ok-{n}" for n in range(6)]
    for batch in b_failed:
        assert import_and_wait(system, batch, BAD, b)["state"] == "failed"
    for n, batch in enumerate(b_done):
        assert import_and_wait(system, batch, csv_for(100 + n), b)["state"] == "completed"

    # Retention runs in the reconciler's pass (every 0.5 s here).
    wait_for(lambda: system.get_job(job_id_for(b_done[2]), key=b)[0] == 404, 10, message="retention of B's completed")
    wait_for(lambda: system.get_job(job_id_for(b_failed[3]), key=b)[0] == 404, 10, message="retention of B's failed")
    # A's records are untouched: B sent more than the count of each kind.
    status, record = system.get_job(job_id_for("a-bad-1"), key=a)
    assert status == 200 and record == a_failed
    assert system.get_job(job_id_for("a-ok-1"), key=a)[0] == 200
    # B's own oldest records are trimmed to its newest 3 of each kind.
    assert [system.get_job(job_id_for(x), key=b)[0] for x in b_failed] == [404] * 4 + [200] * 3
    assert [system.get_job(job_id_for(x), key=b)[0] for x in b_done] == [404] * 3 + [200] * 3

    store = system.store()
    k, c = store.keys, store.client
    assert c.zcard(k.failed_of("owner-a")) == 1 and c.zcard(k.completed_of("owner-a")) == 1
    assert c.zcard(k.failed_of("owner-b")) == 3 and c.zcard(k.completed_of("owner-b")) == 3
    # The all-owner indexes (age-based retention, operators) hold exactly the survivors.
    assert c.zcard(k.failed) == 4 and c.zcard(k.completed) == 4
    # A trimmed failed record takes its upload with it (completed ones freed theirs at once).
    uploads = list(c.scan_iter(match=k.upload("*").replace("{", "\\{").replace("}", "\\}")))
    assert len(uploads) == 4


def test_age_retention_also_clears_the_owner_indexes(make_system: object) -> None:
    system = make_system(IMPORTER_KEEP_COMPLETED_AGE="2", IMPORTER_KEEP_COMPLETED_COUNT="100")  # type: ignore[operator]
    system.start_worker()
    system.start_http()
    import_and_wait(system, "age-a-1", csv_for(1), system.api_key)
    import_and_wait(system, "age-b-1", csv_for(2), system.other_key)
    time.sleep(2.5)
    import_and_wait(system, "age-b-2", csv_for(3), system.other_key)
    store = system.store()
    wait_for(lambda: system.get_job(job_id_for("age-a-1"))[0] == 404, 10, message="retention by age")
    wait_for(lambda: store.client.zcard(store.keys.finished_new) == 0, 10, message="age-b-2 in its owner's index")
    assert store.client.zcard(store.keys.completed_of("owner-a")) == 0
    assert store.client.zrange(store.keys.completed_of("owner-b"), 0, -1) == [b"shipment-age-b-2"]
    assert store.client.zrange(store.keys.completed, 0, -1) == [b"shipment-age-b-2"]


def test_owner_scoped_reads_answer_only_the_owner(system: System) -> None:
    a = system.api_key
    import_and_wait(system, "own-1", csv_for(1), a)
    store = system.store()

    job = store.get_owned_job(job_id_for("own-1"), "owner-a")
    assert job is not None and job.owner == "owner-a" and job.state is JobState.COMPLETED
    assert job == store.get_job(job_id_for("own-1"))
    assert store.get_owned_job(job_id_for("own-1"), "owner-b") is None
    assert store.get_owned_job(job_id_for("own-1"), "") is None
    assert store.get_owned_job("shipment-never", "owner-a") is None

    shipment = store.get_owned_shipment("own-1", "owner-a")
    assert shipment is not None and shipment.result == {"imported": 1, "batchId": "own-1"}
    assert store.get_owned_shipment("own-1", "owner-b") is None
    assert store.get_owned_shipment("never", "owner-a") is None
