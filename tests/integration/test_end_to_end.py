"""the whole path over real HTTP, real dramatiq workers, real Redis."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from importer.domain.shipment import content_key, job_id_for
from tests.integration.support import FIXTURES, System, free_port, queued_messages, stored_messages, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(params=["redis", "rabbitmq"])
def transport(request: pytest.FixtureRequest) -> str:
    """Every scenario here runs on both message transports."""
    return str(request.param)

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()
SEED_SKUS = {"WIDGET-RED-01": 10, "GADGET-BLU-02": 25, "SPROCKET-07": 5}


def test_seed_scenario_gives_the_seed_values(system: System) -> None:
    status, headers, body = system.request(
        "POST", "/api/imports", body=json.dumps({"batchId": "shipment-a-2026", "csv": SEED.decode()}).encode(),
        ctype="application/json",
    )
    assert status == 202, body
    assert json.loads(body) == {"jobId": "shipment-shipment-a-2026", "batchId": "shipment-a-2026", "location": "main", "state": "waiting"}
    assert headers["Location"] == "/api/imports/shipment-shipment-a-2026"

    record = system.wait_state("shipment-shipment-a-2026")
    seed = {
        "id": "shipment-shipment-a-2026", "state": "completed",
        "progress": {"phase": "committed", "rows": 3},
        "result": {"imported": 3, "batchId": "shipment-a-2026"}, "error": None,
    }
    assert {k: record[k] for k in seed} == seed
    assert record["attempt"] == 1
    store = system.store()
    assert store.stock_of(list(SEED_SKUS)) == SEED_SKUS
    assert store.generation() == 1


def test_posting_twice_while_the_record_exists_queues_one_message(make_system: object) -> None:
    system = make_system()  # type: ignore[operator]
    system.start_http()  # no worker yet: messages stay in the queue where we can count them
    first = system.post_csv("twice-1", SEED)
    second = system.post_csv("twice-1", SEED)
    assert first == (202, {"jobId": "shipment-twice-1", "batchId": "twice-1", "location": "main", "state": "waiting"})
    assert second == first
    assert queued_messages(system) == 1

    system.start_worker()
    assert system.wait_state("shipment-twice-1")["state"] == "completed"
    assert system.post_csv("twice-1", SEED)[1]["state"] == "completed"
    assert system.store().stock_of(list(SEED_SKUS)) == SEED_SKUS
    assert system.store().generation() == 1


def test_after_the_record_is_deleted_a_repost_replays_the_earlier_result(system: System) -> None:
    system.post_csv("replay-1", SEED)
    assert system.wait_state("shipment-replay-1")["result"] == {"imported": 3, "batchId": "replay-1"}
    store = system.store()
    store.delete_job_record("shipment-replay-1")  # as retention will
    assert system.get_job("shipment-replay-1")[0] == 404

    # Rows in another order and CRLF endings: the same content.
    reordered = b"sku,quantity\r\nSPROCKET-07,5\r\nWIDGET-RED-01,10\r\nGADGET-BLU-02,25\r\n"
    assert system.post_csv("replay-1", reordered)[0] == 202
    record = system.wait_state("shipment-replay-1")
    assert record["state"] == "completed"
    assert record["result"] == {"imported": 3, "batchId": "replay-1", "replay": True}
    assert store.stock_of(list(SEED_SKUS)) == SEED_SKUS
    assert store.generation() == 1


def test_same_batch_id_with_other_content_is_a_conflict(system: System) -> None:
    system.post_csv("conflict-1", SEED)
    system.wait_state("shipment-conflict-1")
    other = b"sku,quantity\nWIDGET-RED-01,999\n"

    status, problem = system.post_csv("conflict-1", other)
    assert status == 409 and problem["code"] == "batch.conflict"
    # After retention the durable done marker still refuses it.
    system.store().delete_job_record("shipment-conflict-1")
    status, problem = system.post_csv("conflict-1", other)
    assert status == 409 and problem["code"] == "batch.conflict"
    assert system.store().stock_of(list(SEED_SKUS)) == SEED_SKUS


def test_a_waiting_batch_is_the_same_content_in_any_row_order_and_other_rows_conflict(make_system: object) -> None:
    """The POST hashes a new batch's bytes only; a later POST with other bytes
    is compared by content, the waiting job's own upload read for it."""
    system: System = make_system()  # type: ignore[operator]
    system.start_http()  # no worker: the job stays waiting
    assert system.post_csv("identity-1", SEED)[0] == 202
    store = system.store()
    key = store.keys.job("shipment-identity-1")
    assert store.client.hget(key, "contentSha256") == b""  # not computed for a new batch
    assert store.client.hget(key, "rawSha256") == hashlib.sha256(SEED).hexdigest().encode()

    assert system.post_csv("identity-1", SEED) == (202, {"jobId": "shipment-identity-1", "batchId": "identity-1", "location": "main", "state": "waiting"})
    quoted = b'\xef\xbb\xbf"sku","quantity"\r\n"SPROCKET-07",5\r\nGADGET-BLU-02,25\r\nWIDGET-RED-01,10\r\n'
    assert system.post_csv("identity-1", quoted)[0] == 202
    assert store.client.hget(key, "contentSha256") == content_key(SEED).encode()  # kept once compared
    status, problem = system.post_csv("identity-1", SEED.replace(b",25", b",26"))
    assert status == 409 and problem["code"] == "batch.conflict"
    assert system.request("POST", "/api/imports?batchId=identity-1", body=SEED, ctype="text/csv", key=system.other_key)[0] == 409

    system.start_worker()
    assert system.wait_state("shipment-identity-1")["result"] == {"imported": 3, "batchId": "identity-1"}
    # The done marker holds the worker's content key, as before.
    assert system.request("GET", "/api/shipments/identity-1")[0] == 200
    assert store.client.hget(store.keys.done("identity-1"), "contentSha256") == content_key(SEED).encode()
    assert store.generation() == 1


def test_the_worker_refuses_a_conflict_that_got_past_the_door(system: System) -> None:
    """Last line of defence: a job recorded with other content than the done marker."""
    system.post_csv("conflict-2", SEED)
    system.wait_state("shipment-conflict-2")
    store = system.store()
    store.delete_job_record("shipment-conflict-2")
    # Leave the records a producer racing the first import could have left
    # before the done marker existed: a waiting job with other content.
    upload_id = "0" * 32
    store.client.hset(store.keys.job("shipment-conflict-2"), mapping={
        "id": "shipment-conflict-2", "batchId": "conflict-2", "owner": "owner-a", "state": "waiting",
        "attempt": 0, "contentSha256": "other-hash", "uploadId": upload_id, "createdAt": 1, "updatedAt": 1,
    })
    store.client.set(store.keys.upload(upload_id), b"sku,quantity\nWIDGET-RED-01,7\n")
    system.queue().send(job_id="shipment-conflict-2", batch_id="conflict-2", upload_id=upload_id)
    record = system.wait_state("shipment-conflict-2")
    assert record["state"] == "failed"
    assert record["error"]["code"] == "batch.conflict"
    assert store.stock_of(list(SEED_SKUS)) == SEED_SKUS
    assert store.generation() == 1


@pytest.mark.parametrize(
    ("fixture", "code"),
    [
        ("invalid-bad-quantity.csv", "csv.bad_quantity"),
        ("invalid-bad-header.csv", "csv.bad_header"),
        ("invalid-duplicate-sku.csv", "csv.duplicate_sku"),
        ("invalid-not-utf8.csv", "csv.not_utf8"),
    ],
)
def test_invalid_csv_fails_after_one_attempt_with_located_issues(system: System, fixture: str, code: str) -> None:
    batch = fixture.removesuffix(".csv")
    assert system.post_csv(batch, (FIXTURES / fixture).read_bytes())[0] == 202
    record = system.wait_state(job_id_for(batch))
    assert record["state"] == "failed"
    assert record["error"]["code"] == code
    issues = record["error"]["issues"]
    assert issues and all({"line", "column", "code", "message"} <= set(i) for i in issues)
    assert issues[0]["code"] == code and issues[0]["line"] >= 1
    time.sleep(1.5)  # longer than the first retry backoff (1 s): it must not come back
    again = system.get_job(job_id_for(batch))[1]
    assert (again["state"], again["attempt"]) == ("failed", 1)
    assert system.store().generation() == 0


def test_a_v2_message_fails_as_unsupported_and_is_not_retried(system: System) -> None:
    store = system.store()
    upload_id = "1" * 32
    created = store.enqueue(
        job_id="shipment-v2-1", batch_id="v2-1", owner="owner-a", content_sha256="x", upload_id=upload_id, csv=SEED
    )
    assert created.kind == "created"
    system.queue().send_raw({"version": 2, "jobId": "shipment-v2-1", "batchId": "v2-1", "uploadId": upload_id, "new": 1})
    record = system.wait_state("shipment-v2-1")
    assert record["state"] == "failed"
    assert record["error"]["code"] == "contract.unsupported_version"
    time.sleep(1.5)
    assert system.get_job("shipment-v2-1")[1]["attempt"] == 1
    assert store.generation() == 0


def test_a_worker_killed_after_the_apply_and_before_the_ack_applies_once(make_system: object) -> None:
    system = make_system()  # type: ignore[operator]
    system.start_http()
    doomed = system.start_worker(IMPORTER_FAULT="after_apply:60")
    system.post_csv("kill-1", SEED)
    # The Lua apply has committed (the job is completed atomically with it);
    # the worker now sleeps before dramatiq acknowledges the message.
    system.wait_state("shipment-kill-1")
    wait_for(lambda: "fault.injected" in doomed.log(), 10, message="worker inside the window")
    # The message is held by the doomed worker: fetched, not acknowledged.
    assert queued_messages(system) == 0
    assert stored_messages(system) in (1, None)
    doomed.kill()

    survivor = system.start_worker()
    # Redelivered after the heartbeat timeout (3 s here), seen as finished, acked;
    # or dropped first by the reconciler as a stranded message of a finished job.
    wait_for(
        lambda: '"reason": "finished"' in survivor.log() or "reconciler.stranded_acks_dropped" in survivor.log(), 30,
        message="redelivery to the new worker, or the stranded message dropped",
    )
    if system.transport == "redis":
        wait_for(lambda: stored_messages(system) == 0, 10, message="the redelivered message acknowledged")
    store = system.store()
    assert store.stock_of(list(SEED_SKUS)) == SEED_SKUS
    assert store.generation() == 1
    record = system.get_job("shipment-kill-1")[1]
    assert (record["state"], record["result"]) == ("completed", {"imported": 3, "batchId": "kill-1"})


def test_a_time_limit_that_fires_once_the_apply_committed_is_no_failure(make_system: object) -> None:
    """The time limit can only interrupt Python: one that fires while the worker
    waits for the apply script's reply (a large file's script runs long) is raised
    once the script has committed. Forced here: the worker sleeps 2 s after the
    apply, past its 1 s limit. The import is completed once, its record untouched,
    and the worker's log says what happened, without an attempt_failed warning."""
    system = make_system(IMPORTER_TIME_LIMIT="1")  # type: ignore[operator]
    system.start_http()
    worker = system.start_worker(IMPORTER_FAULT="after_apply:2")
    status, body = system.post_csv("late-limit-1", SEED)
    assert status == 202, body
    wait_for(lambda: "import.interrupted_after_end" in worker.log(), 20, message="the late interruption's line")
    # dramatiq sends the interrupted message again: that delivery finds the job finished.
    wait_for(lambda: '"reason": "finished"' in worker.log(), 20, message="the retried delivery skipped")
    record = system.get_job("shipment-late-limit-1")[1]
    assert (record["state"], record["attempt"], record["error"]) == ("completed", 1, None), record
    assert record["result"] == {"imported": 3, "batchId": "late-limit-1"}, record
    store = system.store()
    assert store.stock_of(list(SEED_SKUS)) == SEED_SKUS and store.generation() == 1
    lines = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
    late = [line for line in lines if line.get("event") == "import.interrupted_after_end"]
    assert len(late) == 1 and late[0]["level"] == "info", late
    assert (late[0]["jobId"], late[0]["attempt"], late[0]["code"]) == ("shipment-late-limit-1", 1, "import.time_limit"), late
    assert not [line for line in lines if line.get("event") == "import.attempt_failed"], worker.log()


def test_a_worker_killed_before_the_apply_is_retried_as_attempt_2(make_system: object) -> None:
    system = make_system()  # type: ignore[operator]
    system.start_http()
    doomed = system.start_worker(IMPORTER_FAULT="before_apply:60")
    system.post_csv("kill-2", SEED)
    wait_for(lambda: "fault.injected" in doomed.log(), 10, message="worker inside the window")
    assert system.get_job("shipment-kill-2")[1]["state"] == "active"
    doomed.kill()
    system.start_worker()
    record = system.wait_state("shipment-kill-2")
    assert record["state"] == "completed"
    assert record["attempt"] == 2
    assert record["progress"] == {"phase": "committed", "rows": 3}
    assert system.store().generation() == 1


def test_a_crash_between_recording_and_sending_is_repaired_by_the_sweeper(make_system: object) -> None:
    system = make_system(IMPORTER_WAITING_GRACE="1")  # type: ignore[operator]
    crashing = system.start_http(IMPORTER_FAULT="before_send:crash")
    store = system.store()
    if system.transport == "redis":
        # The message is written by the script that records the job: there is
        # no "between", the crash point is never reached.
        assert system.post_csv("orphan-1", SEED)[0] == 202
        assert crashing.popen.poll() is None
        assert queued_messages(system) == 1
        assert store.client.zcard(store.keys.unsent) == 0
    else:
        try:
            system.post_csv("orphan-1", SEED)
        except OSError:
            pass  # the HTTP worker died mid-request, as intended
        assert queued_messages(system) == 0  # recorded, never sent
    record = store.get_job("shipment-orphan-1")
    assert record is not None and record.state == "waiting"
    crashing.stop()

    system.start_worker()
    system.start_http()
    record = system.wait_state("shipment-orphan-1", timeout=30)
    assert record["state"] == "completed"
    assert store.stock_of(list(SEED_SKUS)) == SEED_SKUS
    assert store.generation() == 1


def test_health_is_200_with_redis_and_503_without(system: System, make_system: object) -> None:
    status, _, body = system.request("GET", "/health", key=None)
    workers = {"alive": 1, "acceptedVersions": [1, 3], "producerVersion": 1, "acceptsImports": True}
    intake = {"paused": False, "locations": []}
    assert (status, json.loads(body)) == (200, {"status": "ok", "workers": workers, "intake": intake})

    broken = make_system(IMPORTER_REDIS_URL="redis://127.0.0.1:1/0")  # type: ignore[operator]
    port = free_port()
    broken._spawn("http", ["serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"], broken.env)
    url = f"http://127.0.0.1:{port}"

    def answered() -> tuple[int, bytes] | None:
        try:
            status, _, body = broken.request("GET", "/health", key=None, base_url=url)
            return status, body
        except OSError:
            return None

    status, body = wait_for(answered, 30, 0.1, message="health of the server without Redis")
    assert status == 503
    assert json.loads(body) == {"status": "unavailable", "reason": "redis_unreachable"}
