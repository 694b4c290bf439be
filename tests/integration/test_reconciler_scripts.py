"""reconcile.lua, renew.lua and the fencing token in start/progress/apply/fail,
on a real Redis (no processes: the store's calls in the order workers make them)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from importer.adapters.redis.records import events_after, stream_id_key
from importer.adapters.settings import Settings
from importer.domain.errors import PublicError
from importer.domain.shipment import Row, Shipment
from tests.integration.support import ProbeStore

pytestmark = pytest.mark.integration

SHIPMENT = Shipment((Row("A", 2), Row("B", 3)))


@pytest.fixture
def store(redis_url: str) -> Iterator[ProbeStore]:
    client = redis.Redis.from_url(redis_url)
    prefix = "{r" + uuid.uuid4().hex[:12] + "}:"
    settings = Settings(key_prefix=prefix, waiting_grace_s=0.3, attempt_lease_s=0.3, stall_margin_s=0.3, time_limit_s=1)
    yield ProbeStore(client, settings, clock_ms=lambda: int(time.time() * 1000))
    keys = list(client.scan_iter(match=prefix.replace("{", "\\{").replace("}", "\\}") + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def _record(store: ProbeStore, batch_id: str = "b1") -> tuple[str, str]:
    job_id, upload_id = f"shipment-{batch_id}", uuid.uuid4().hex
    out = store.enqueue(job_id=job_id, batch_id=batch_id, owner="o", content_sha256=SHIPMENT.content_sha256,
                        upload_id=upload_id, csv=b"sku,quantity\nA,2\nB,3\n")
    assert out.kind == "created"
    return job_id, upload_id


def _apply(store: ProbeStore, job_id: str, upload_id: str, attempt: int, token: str) -> str:
    return store.validated_and_apply(job_id=job_id, upload_id=upload_id, attempt=attempt, batch_id="b1",
                                     owner="o", shipment=SHIPMENT, token=token).kind


def test_unsent_and_sent_jobs_are_sent_again_after_the_grace(store: ProbeStore) -> None:
    never_sent, _ = _record(store, "b1")
    sent, _ = _record(store, "b2")
    store.mark_sent(sent)
    assert store.reconcile() == []
    time.sleep(0.4)
    assert sorted(j for j, _, _ in store.reconcile()) == [never_sent, sent]
    assert store.reconcile() == []  # next deadline: grace x 2^n later


def test_stalled_attempt_is_taken_back_and_fenced_off(store: ProbeStore) -> None:
    job_id, upload_id = _record(store)
    store.reconcile()  # a pass: the store is answering (no outage before the next one)
    first = store.start_attempt(job_id, upload_id).started
    assert first is not None and first.token
    assert store.start_attempt(job_id, upload_id).kind == "busy"  # a duplicate under a live lease
    assert store.renew([(job_id, first.token)]) == 1
    time.sleep(0.4)  # no renewal: the lease runs out
    assert [j for j, _, _ in store.reconcile()] == [job_id]
    record = store.get_job(job_id)
    assert record is not None and record.state == "retrying" and record.error["code"] == "import.worker_lost"
    assert store.client.hget(store.keys.job(job_id), "stalls") == b"1"
    second = store.start_attempt(job_id, upload_id).started
    assert second is not None and second.attempt == 2 and second.token != first.token
    # The stale attempt wakes up: nothing it writes lands.
    assert store.renew([(job_id, first.token)]) == 0
    assert _apply(store, job_id, upload_id, 1, first.token) == "stale"
    failed = store.record_failure(job_id=job_id, attempt=1, final=False, error=PublicError.from_code("import.time_limit"),
                                  diagnostic="late", next_attempt_at_ms=int(time.time() * 1000), token=first.token)
    assert failed == "stale"
    assert store.get_job(job_id).state == "active"  # type: ignore[union-attr]
    assert store.stock_of(["A"]) == {"A": 0}
    assert _apply(store, job_id, upload_id, 2, second.token) == "applied"
    assert store.stock_of(["A", "B"]) == {"A": 2, "B": 3}
    time.sleep(0.4)
    assert store.reconcile() == []  # a finished job has no deadline


def test_stalls_past_their_limit_fail_the_job_as_stalled(store: ProbeStore) -> None:
    """A stall is counted apart from the attempts (IMPORTER_MAX_STALLS, 2)."""
    job_id, upload_id = _record(store)
    store.reconcile()
    for attempt in (1, 2, 3):
        started = store.start_attempt(job_id, upload_id).started
        assert started is not None and started.attempt == attempt
        time.sleep(0.4)
        store.reconcile()
    record = store.get_job(job_id)
    assert record is not None and record.state == "failed" and record.error["code"] == "import.stalled"
    assert store.reconcile() == []


def _fail(store: ProbeStore, job_id: str, started: object, *, outage: bool = False) -> str:
    return store.record_failure(
        job_id=job_id, attempt=started.attempt, final=False if outage else None,  # type: ignore[attr-defined]
        error=PublicError.from_code("import.store_unavailable" if outage else "import.time_limit"),
        diagnostic="x", next_attempt_at_ms=int(time.time() * 1000), token=started.token, outage=outage,  # type: ignore[attr-defined]
    )


def test_attempts_the_import_can_be_blamed_for_are_counted_and_outages_are_not(store: ProbeStore) -> None:
    job_id, upload_id = _record(store)
    for _ in range(5):  # five attempts that lost their store: none counts
        started = store.start_attempt(job_id, upload_id).started
        assert started is not None
        assert _fail(store, job_id, started, outage=True) == "retrying"
    outcomes = []
    for _ in range(3):  # three that failed on their own: the third is final
        started = store.start_attempt(job_id, upload_id).started
        assert started is not None
        outcomes.append(_fail(store, job_id, started))
    assert outcomes == ["retrying", "retrying", "failed"]
    record = store.get_job(job_id)
    assert record is not None and record.attempt == 8 and record.error["code"] == "import.time_limit"
    assert store.client.hget(store.keys.job(job_id), "outages") == b"5"


def test_a_lease_that_ran_out_while_no_pass_could_run_blames_nobody(store: ProbeStore) -> None:
    """The pass before this one was long ago (the store was away, or no worker
    ran): an expired lease gets one more lease, and its worker carries on."""
    job_id, upload_id = _record(store)
    first = store.start_attempt(job_id, upload_id).started
    assert first is not None
    time.sleep(0.4)  # the lease ran out; the previous pass is unknown (as after an outage)
    assert store.reconcile() == []
    record = store.get_job(job_id)
    assert record is not None and record.state == "active" and record.attempt == 1
    assert store.client.hget(store.keys.job(job_id), "stalls") is None
    assert store.renew([(job_id, first.token)]) == 1  # the worker is back: its lease holds
    assert _apply(store, job_id, upload_id, 1, first.token) == "applied"


@pytest.mark.parametrize("one_step", [False, True], ids=["separate-steps", "one-step"])
def test_a_delivery_that_finds_a_lost_attempt_leaves_it_to_the_reconciler(
    store: ProbeStore, one_step: bool,
) -> None:
    """A redelivered message can reach start.lua before the reconciler sees the
    expired lease (dramatiq requeues a dead worker's messages itself). It does
    not take over: the reconciler decides whom to blame, then the job starts
    again. The history: the lost attempt 'retrying' (import.worker_lost), then
    the new attempt."""
    job_id, upload_id = _record(store)
    store.reconcile()
    first = store.start_attempt(job_id, upload_id).started
    assert first is not None
    time.sleep(0.4)  # the lease runs out; no reconciler pass runs
    assert store.start_attempt(job_id, upload_id).kind == "busy"
    assert [j for j, _, _ in store.reconcile()] == [job_id]
    if one_step:
        outcome, applied = store.start_and_apply(job_id=job_id, upload_id=upload_id, batch_id="b1", shipment=SHIPMENT)
        assert outcome.started is not None and outcome.started.attempt == 2
        assert applied is not None and applied.kind == "applied"
    else:
        second = store.start_attempt(job_id, upload_id).started
        assert second is not None and second.attempt == 2
        assert _apply(store, job_id, upload_id, 2, second.token) == "applied"
    events = [(e["event"], int(e["attempt"])) for e in store.job_events(job_id, "0-0", None)]
    assert events[:4] == [("waiting", 0), ("active", 1), ("retrying", 1), ("active", 2)]
    assert events[-1] == ("completed", 2)
    lost = [e for e in store.job_events(job_id, "0-0", None) if e["event"] == "retrying"]
    assert lost[0]["data"]["code"] == "import.worker_lost"
    assert _apply(store, job_id, upload_id, 1, first.token) == "finished"  # the lost attempt wakes up: no change
    assert store.stock_of(["A", "B"]) == {"A": 2, "B": 3}


def _global_events(store: ProbeStore) -> list[dict[str, object]]:
    return events_after(
        ((i.decode(), f) for i, f in store.client.xrange(store.keys.events)), "0-0",
    )


@pytest.mark.parametrize("clock", ["now", "ahead"], ids=["newest-entry-now", "newest-entry-ahead-of-the-clock"])
def test_a_one_step_call_gives_each_of_its_events_an_id_of_its_own_after_the_newest_entry(
    store: ProbeStore, clock: str,
) -> None:
    """common.lua, flush_events: the 4 events of a one-step import are one entry
    in P:events (and in the job's stream) and keep ids of their own, after every
    id already in the stream, even one ahead of the server's clock."""
    job_id, upload_id = _record(store)
    if clock == "ahead":  # an entry an hour ahead (another server's clock, before a failover)
        store.client.xadd(store.keys.events, {"event": "waiting", "jobId": "x", "batchId": "x", "attempt": 0, "data": "{}"},
                          id=f"{int(time.time() * 1000) + 3_600_000}-5")
    before = store.client.xrevrange(store.keys.events, count=1)[0][0].decode()
    outcome, applied = store.start_and_apply(job_id=job_id, upload_id=upload_id, batch_id="b1", shipment=SHIPMENT)
    assert applied is not None and applied.kind == "applied"
    entries = store.client.xrange(store.keys.events, min="(" + before)
    assert len(entries) == 1
    mine = [e for e in _global_events(store) if e["jobId"] == job_id]
    assert [e["event"] for e in mine] == ["waiting", "active", "progress", "progress", "completed"]
    ids = [stream_id_key(str(e["id"])) for e in mine]
    assert ids == sorted(set(ids)) and ids[1] > stream_id_key(before)
    assert store.job_events(job_id, "0-0", None) == mine


def test_events_are_written_when_the_streams_newest_entries_were_deleted_by_hand(store: ProbeStore) -> None:
    """The stream's last id is above its newest entry (an operator's XDEL): the
    ids the call gives are refused, and the entry takes the server's own id."""
    job_id, upload_id = _record(store)
    ahead = f"{int(time.time() * 1000) + 3_600_000}-0"
    store.client.xadd(store.keys.events, {"event": "waiting", "jobId": "x", "batchId": "x", "attempt": 0, "data": "{}"}, id=ahead)
    store.client.xdel(store.keys.events, ahead)
    outcome, applied = store.start_and_apply(job_id=job_id, upload_id=upload_id, batch_id="b1", shipment=SHIPMENT)
    assert applied is not None and applied.kind == "applied"
    (last_id, fields), = store.client.xrevrange(store.keys.events, count=1)
    assert fields[b"event"] == b"completed" and stream_id_key(last_id.decode()) > stream_id_key(ahead)
    # Under the server's id, the entry names its earlier events' ids: each event once, in order.
    assert fields[b"id.1"] and fields[b"id.3"]
    events = store.job_events(job_id, "0-0", None)
    assert [e["event"] for e in events] == ["waiting", "active", "progress", "progress", "completed"]
    ids = [stream_id_key(str(e["id"])) for e in events]
    assert ids == sorted(set(ids))
