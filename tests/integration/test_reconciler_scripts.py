"""reconcile.lua, renew.lua and the fencing token in start/progress/apply/fail,
on a real Redis (no processes: the store's calls in the order workers make them)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

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
    first = store.start_attempt(job_id, upload_id).started
    assert first is not None and first.token
    assert store.start_attempt(job_id, upload_id).kind == "busy"  # a duplicate under a live lease
    assert store.renew([(job_id, first.token)]) == 1
    time.sleep(0.4)  # no renewal: the lease runs out
    assert [j for j, _, _ in store.reconcile()] == [job_id]
    record = store.get_job(job_id)
    assert record is not None and record.state == "retrying" and record.error["code"] == "import.worker_lost"
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


def test_attempts_used_up_fail_the_job(store: ProbeStore) -> None:
    job_id, upload_id = _record(store)
    for attempt in (1, 2, 3):
        started = store.start_attempt(job_id, upload_id).started
        assert started is not None and started.attempt == attempt
        time.sleep(0.4)
        store.reconcile()
    record = store.get_job(job_id)
    assert record is not None and record.state == "failed" and record.error["code"] == "import.attempts_exhausted"
    assert store.reconcile() == []


@pytest.mark.parametrize("one_step", [False, True], ids=["separate-steps", "one-step"])
def test_a_delivery_that_takes_over_a_lost_attempt_records_it_as_the_reconciler_does(
    store: ProbeStore, one_step: bool,
) -> None:
    """A redelivered message can reach start.lua before the reconciler sees the
    expired lease (dramatiq requeues a dead worker's messages itself). The job's
    history must read the same either way: the lost attempt 'retrying'
    (import.worker_lost), then the new attempt."""
    job_id, upload_id = _record(store)
    first = store.start_attempt(job_id, upload_id).started
    assert first is not None
    time.sleep(0.4)  # the lease runs out; no reconciler pass runs
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
