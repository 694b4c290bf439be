"""The store's ports (domain/ports.py), one set of cases run against the
in-memory fake the unit tests use (tests/unit/fakes.py) and against the real
Redis store on a real server: when the fake drifts from Redis, this fails.

Each case goes through the ports only: JobRecorder (enqueue, read_upload,
mark_sent), JobReads (owned reads, the owner's list), StoreHealth (rate
token, ping, live workers)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from importer.domain.jobs import JobState
from importer.domain.ports import JobStore
from tests.unit.fakes import FakeStore

CSV = b"sku,quantity\nA-1,3\n"


@pytest.fixture(params=["fake", pytest.param("redis", marks=pytest.mark.integration)])
def store(request: pytest.FixtureRequest) -> Iterator[JobStore]:
    if request.param == "fake":
        yield FakeStore()
        return
    import redis

    from importer.adapters.bootstrap import clock_ms
    from importer.adapters.redis.store import RedisStore
    from importer.adapters.settings import Settings

    url = request.getfixturevalue("redis_url")
    prefix = "{c" + uuid.uuid4().hex[:10] + "}:"
    settings = Settings.from_env({"IMPORTER_REDIS_URL": url, "IMPORTER_KEY_PREFIX": prefix, "IMPORTER_RATE_LIMIT": "2"})
    client = redis.Redis.from_url(url)
    try:
        yield RedisStore(client, settings, clock_ms=clock_ms)
    finally:
        for key in client.scan_iter(match=prefix.replace("{", "\\{").replace("}", "\\}") + "*"):
            client.delete(key)
        client.close()


def enqueue(store: JobStore, batch: str, owner: str = "owner-a", content: str = "c1", raw: str = "r1", **kw: Any) -> Any:
    return store.enqueue(
        job_id=f"shipment-{batch}", batch_id=batch, owner=owner, content_sha256=content,
        upload_id=f"up-{batch}-{uuid.uuid4().hex[:6]}", csv=CSV, raw_sha256=raw, **kw,
    )


def test_a_job_is_recorded_once_with_its_upload(store: JobStore) -> None:
    first = enqueue(store, "b1")
    assert (first.kind, first.state) == ("created", JobState.WAITING)
    again = enqueue(store, "b1")
    assert (again.kind, again.state) == ("exists", JobState.WAITING)
    record = store.get_owned_job("shipment-b1", "owner-a")
    assert record is not None and (record.batch_id, record.owner, record.state, record.attempt) == ("b1", "owner-a", "waiting", 0)
    assert store.read_upload(record.upload_id) == CSV
    assert store.read_upload("up-none") is None


def test_another_owner_sees_nothing_and_conflicts(store: JobStore) -> None:
    enqueue(store, "b2")
    assert store.get_owned_job("shipment-b2", "owner-b") is None
    assert store.get_owned_job("shipment-missing", "owner-a") is None
    assert enqueue(store, "b2", owner="owner-b").kind == "conflict"
    assert store.get_owned_shipment("b2", "owner-a") is None  # not applied yet


def test_other_bytes_under_the_same_batch_need_the_content_key_then_conflict_or_match(store: JobStore) -> None:
    enqueue(store, "b3", content="c1", raw="r1")
    needed = enqueue(store, "b3", content="", raw="r2")
    assert needed.kind == "content_needed"
    assert enqueue(store, "b3", content="c1", raw="r2").kind == "exists"
    assert enqueue(store, "b3", content="c9", raw="r3").kind == "conflict"


def test_the_owners_list_is_newest_first_and_pages(store: JobStore) -> None:
    for n in range(3):
        enqueue(store, f"l{n}")
    enqueue(store, "other", owner="owner-b")
    page, cursor = store.list_jobs("owner-a", limit=2)
    assert len(page) == 2 and cursor is not None
    rest, end = store.list_jobs("owner-a", limit=2, after=cursor)
    assert end is None
    ids = [r.id for r in page + rest]
    assert sorted(ids) == ["shipment-l0", "shipment-l1", "shipment-l2"]
    assert all(r.owner == "owner-a" for r in page + rest)
    waiting, _ = store.list_jobs("owner-a", limit=10, state="waiting")
    assert len(waiting) == 3
    assert store.list_jobs("owner-a", limit=10, state="completed")[0] == []


def test_mark_sent_keeps_the_record(store: JobStore) -> None:
    enqueue(store, "b5")
    store.mark_sent("shipment-b5")
    record = store.get_owned_job("shipment-b5", "owner-a")
    assert record is not None and record.state == "waiting"


def test_health_answers_and_no_worker_is_live(store: JobStore) -> None:
    assert store.ping() is True
    assert store.live_workers() == {}
    assert store.take_rate_token("owner-a") == 0


# -- RetryStore -----------------------------------------------------------------------

RETRYABLE = frozenset({"import.attempts_exhausted", "import.time_limit"})


def fail(store: JobStore, job_id: str, code: str) -> None:
    """Fail the job as a worker would (its attempt started, then a final failure)."""
    from dataclasses import replace

    from importer.domain.errors import PublicError

    error = PublicError.from_code(code)
    if isinstance(store, FakeStore):
        store.jobs[job_id] = replace(store.jobs[job_id], state=JobState.FAILED, attempt=1, error=error.to_dict())
        return
    record = store.get_owned_job(job_id, "owner-a")
    assert record is not None
    started = store.start_attempt(job_id, record.upload_id)  # type: ignore[attr-defined]
    assert started.started is not None
    assert store.record_failure(  # type: ignore[attr-defined]
        job_id=job_id, attempt=started.attempt, final=True, error=error, diagnostic="test", next_attempt_at_ms=None,
        token=started.started.token,
    ) == "failed"


def test_a_failed_job_is_retried_once_as_a_new_chain_with_its_upload(store: JobStore) -> None:
    enqueue(store, "r1")
    old_upload = store.get_owned_job("shipment-r1", "owner-a").upload_id  # type: ignore[union-attr]
    fail(store, "shipment-r1", "import.attempts_exhausted")
    assert [r.id for r in store.list_jobs("owner-a", limit=10, state="failed")[0]] == ["shipment-r1"]

    new_upload = "n" * 32
    outcome = store.retry_job(job_id="shipment-r1", owner="owner-a", upload_id=new_upload, retryable=RETRYABLE)

    assert (outcome.kind, outcome.batch_id, outcome.retries, outcome.sent) == ("retried", "r1", 1, False)
    record = store.get_owned_job("shipment-r1", "owner-a")
    assert record is not None
    assert (record.state, record.attempt, record.error, record.retries, record.upload_id) == ("waiting", 0, None, 1, new_upload)
    assert (record.started_at_ms, record.finished_at_ms) == (None, None)
    assert store.read_upload(new_upload) == CSV and store.read_upload(old_upload) is None
    assert store.list_jobs("owner-a", limit=10, state="failed")[0] == []
    last = store.job_events("shipment-r1", "0-0", None)[-1]
    assert (last["event"], last["attempt"], last["data"]) == ("waiting", 0, {"retry": 1})
    again = store.retry_job(job_id="shipment-r1", owner="owner-a", upload_id="m" * 32, retryable=RETRYABLE)
    assert (again.kind, again.reason, again.state) == ("not_retryable", "state", "waiting")


def test_a_retry_of_another_owners_or_a_missing_job_is_missing(store: JobStore) -> None:
    enqueue(store, "r2")
    fail(store, "shipment-r2", "import.time_limit")
    for owner, job_id in (("owner-b", "shipment-r2"), ("owner-a", "shipment-none"), ("owner-a", "no job")):
        assert store.retry_job(job_id=job_id, owner=owner, upload_id="n" * 32, retryable=RETRYABLE).kind == "missing"
    record = store.get_owned_job("shipment-r2", "owner-a")
    assert record is not None and record.state == "failed"


def test_a_failure_outside_the_list_is_not_retried_and_keeps_its_upload(store: JobStore) -> None:
    enqueue(store, "r3")
    fail(store, "shipment-r3", "csv.bad_quantity")
    outcome = store.retry_job(job_id="shipment-r3", owner="owner-a", upload_id="n" * 32, retryable=RETRYABLE)
    assert (outcome.kind, outcome.reason, outcome.state, outcome.error_code) == ("not_retryable", "code", "failed", "csv.bad_quantity")
    record = store.get_owned_job("shipment-r3", "owner-a")
    assert record is not None and record.state == "failed" and store.read_upload(record.upload_id) == CSV
    waiting = store.retry_job(job_id="shipment-b-none", owner="owner-a", upload_id="n" * 32, retryable=RETRYABLE)
    assert waiting.kind == "missing"
    enqueue(store, "r4")
    not_failed = store.retry_job(job_id="shipment-r4", owner="owner-a", upload_id="n" * 32, retryable=RETRYABLE)
    assert (not_failed.kind, not_failed.reason, not_failed.state) == ("not_retryable", "state", "waiting")
