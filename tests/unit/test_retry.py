"""Retrying a failed import: the decision (domain/retry_import.py), the use
case over the fakes, and POST /api/imports/{jobId}/retry through the real
WSGI app on the in-memory store; the event's rendering by the observer and
by `importer retry --wait`'s view."""

from __future__ import annotations

import re

from dataclasses import replace
from typing import Any

import pytest

from importer.adapters.processes.event_stream_client import apply_event
from importer.adapters.processes.observer import format_line
from importer.domain.errors import EXPLANATIONS, JobNotFound, NotRetryable, PublicError
from importer.domain.jobs import JobState
from importer.domain.retry_import import RETRYABLE_CODES, retry_import, retry_refusal
from tests.unit.fakes import FakeSender, FakeStore, SentMessage
from tests.unit.test_http_handlers import KEY_B, VALID_CSV, Harness, assert_problem, make_harness, without_request_id

CSV_CODES = ["csv.not_utf8", "csv.bad_header", "csv.bad_quantity", "csv.duplicate_sku", "csv.too_many_rows", "csv.invalid"]


# -- the decision -------------------------------------------------------------------


@pytest.mark.parametrize("code", sorted(RETRYABLE_CODES))
def test_a_failure_from_outside_the_file_is_retryable(code: str) -> None:
    assert retry_refusal("failed", code) is None


@pytest.mark.parametrize("code", [*CSV_CODES, "batch.conflict", "stock.overflow", "import.upload_missing", "internal", None])
def test_a_failure_the_same_bytes_would_meet_again_is_not(code: str | None) -> None:
    refusal = retry_refusal("failed", code)
    assert refusal is not None and refusal[0] == "code"


def test_a_validation_failure_says_why_it_is_not_retried() -> None:
    refusal = retry_refusal("failed", "csv.bad_quantity")
    assert refusal is not None
    assert "the same bytes give the same issues" in refusal[1]
    assert "new batchId" in refusal[1]


@pytest.mark.parametrize("state", ["waiting", "active", "retrying", "completed"])
def test_only_a_failed_import_is_retried(state: str) -> None:
    refusal = retry_refusal(state, "import.attempts_exhausted")
    assert refusal is not None and refusal[0] == "state" and state in refusal[1]


def test_a_retryable_failure_whose_upload_is_gone_is_not_retried() -> None:
    refusal = retry_refusal("failed", "import.time_limit", upload_kept=False)
    assert refusal is not None and refusal[0] == "upload_gone"


def test_the_permanent_codes_and_the_refusal_code_are_explained() -> None:
    assert "job.not_retryable" in EXPLANATIONS
    for code in ("stock.overflow", "batch.conflict", "import.upload_missing"):
        assert code not in RETRYABLE_CODES


# -- the use case over the fakes ----------------------------------------------------------


def failed_store(code: str = "import.attempts_exhausted", **kw: Any) -> FakeStore:
    store = FakeStore(**kw)
    store.enqueue(job_id="shipment-b-1", batch_id="b-1", owner="owner-a", content_sha256="", upload_id="u" * 32, csv=b"x")
    record = store.jobs["shipment-b-1"]
    store.jobs["shipment-b-1"] = replace(
        record, state=JobState.FAILED, attempt=3, error=PublicError.from_code(code).to_dict(), finished_at_ms=1,
    )
    return store


def test_the_retry_is_a_new_chain_from_the_kept_upload_then_sent() -> None:
    store, sender = failed_store(), FakeSender()

    accepted = retry_import(store, sender, job_id="shipment-b-1", owner="owner-a", upload_id="n" * 32)

    assert (accepted.job_id, accepted.batch_id, accepted.state) == ("shipment-b-1", "b-1", "waiting")
    record = store.jobs["shipment-b-1"]
    assert (record.state, record.attempt, record.error, record.retries, record.upload_id) == ("waiting", 0, None, 1, "n" * 32)
    assert store.uploads == {"n" * 32: b"x"}  # the same bytes, under the new upload id
    assert sender.sent == [SentMessage("shipment-b-1", "b-1", "n" * 32)]
    assert store.marked_sent == ["shipment-b-1"]
    assert store.events["shipment-b-1"][-1]["data"] == {"retry": 1}


def test_on_the_redis_transport_the_message_is_written_with_the_retry() -> None:
    store, sender = failed_store(sends_with_record=True), FakeSender()
    retry_import(store, sender, job_id="shipment-b-1", owner="owner-a", upload_id="n" * 32)
    assert sender.sent == [] and store.marked_sent == []
    assert store.calls[-1] == "retry_job"


def test_a_second_retry_finds_it_waiting_and_is_refused() -> None:
    store, sender = failed_store(), FakeSender()
    retry_import(store, sender, job_id="shipment-b-1", owner="owner-a", upload_id="n" * 32)
    with pytest.raises(NotRetryable) as refused:
        retry_import(store, sender, job_id="shipment-b-1", owner="owner-a", upload_id="m" * 32)
    assert refused.value.state == "waiting"
    assert len(sender.sent) == 1


def test_another_owners_job_is_not_found_like_a_missing_one() -> None:
    store, sender = failed_store(), FakeSender()
    for owner, job_id in (("owner-b", "shipment-b-1"), ("owner-a", "shipment-nope"), ("owner-a", "not-a-job-id!")):
        with pytest.raises(JobNotFound):
            retry_import(store, sender, job_id=job_id, owner=owner, upload_id="n" * 32)
    assert store.jobs["shipment-b-1"].state == "failed" and sender.sent == []


def test_a_csv_failure_is_refused_with_its_code() -> None:
    store, sender = failed_store("csv.bad_quantity"), FakeSender()
    with pytest.raises(NotRetryable) as refused:
        retry_import(store, sender, job_id="shipment-b-1", owner="owner-a", upload_id="n" * 32)
    assert refused.value.error_code == "csv.bad_quantity"
    assert "the same bytes give the same issues" in refused.value.detail
    assert store.jobs["shipment-b-1"].state == "failed" and sender.sent == []


# -- POST /api/imports/{jobId}/retry ------------------------------------------------------


def harness(code: str = "import.attempts_exhausted") -> Harness:
    h = make_harness()
    assert h.post_json({"batchId": "b-r", "csv": VALID_CSV}).status == 202
    record = h.store.jobs["shipment-b-r"]
    h.store.jobs["shipment-b-r"] = replace(record, state=JobState.FAILED, attempt=3, error=PublicError.from_code(code).to_dict())
    h.sender.sent.clear()
    h.store.rate_tokens.clear()
    return h


def retry(h: Harness, job_id: str = "shipment-b-r", **kw: Any) -> Any:
    return h.call("POST", f"/api/imports/{job_id}/retry", **kw)


def test_the_owner_retries_a_failed_import_202_like_an_enqueue() -> None:
    h = harness()
    before = h.get_job("shipment-b-r").json()
    assert (before["state"], before["retryable"], before["retries"]) == ("failed", True, 0)

    result = retry(h)

    assert result.status == 202
    assert result.json() == {"jobId": "shipment-b-r", "batchId": "b-r", "location": "main", "state": "waiting"}
    assert result.header("Location") == "/api/imports/shipment-b-r"
    assert [m.job_id for m in h.sender.sent] == ["shipment-b-r"]
    after = h.get_job("shipment-b-r").json()
    assert (after["state"], after["attempt"], after["error"], after["retries"], after["retryable"]) == ("waiting", 0, None, 1, False)
    assert h.store.rate_tokens == ["owner-a"]  # a POST of the owner's rate limit


def test_a_retry_reads_no_body() -> None:
    from tests.unit.test_http_handlers import ExplodingStream

    h = harness()
    assert retry(h, stream=ExplodingStream(), content_length="5").status == 202


def test_another_owner_gets_the_same_404_bytes_as_for_a_missing_job() -> None:
    h = harness()

    foreign = retry(h, key=KEY_B)
    missing = retry(h, "shipment-never-sent", key=KEY_B)
    get_missing = h.get_job("shipment-never-sent", key=KEY_B)

    assert_problem(foreign, 404, "job.not_found")
    assert foreign.body == missing.body == get_missing.body
    assert without_request_id(foreign.headers) == without_request_id(missing.headers)
    assert h.store.jobs["shipment-b-r"].state == "failed" and h.sender.sent == []


def test_a_validation_failure_answers_409_with_the_reason_and_is_not_retried() -> None:
    h = harness("csv.bad_quantity")
    assert h.get_job("shipment-b-r").json()["retryable"] is False

    result = retry(h)

    body = assert_problem(result, 409, "job.not_retryable")
    assert body["state"] == "failed" and body["errorCode"] == "csv.bad_quantity"
    assert "the same bytes give the same issues" in body["detail"]
    assert h.store.jobs["shipment-b-r"].state == "failed" and h.sender.sent == []


@pytest.mark.parametrize("state", ["waiting", "active", "retrying", "completed"])
def test_an_import_that_is_not_failed_answers_409(state: str) -> None:
    h = harness()
    h.store.jobs["shipment-b-r"] = replace(h.store.jobs["shipment-b-r"], state=state, error=None)
    body = assert_problem(retry(h), 409, "job.not_retryable")
    assert body["state"] == state and "errorCode" not in body
    assert h.sender.sent == []


def test_a_rate_limited_owner_gets_429_before_anything_is_read() -> None:
    h = harness()
    h.store.rate_wait_ms = 1500
    h.store.calls.clear()
    result = retry(h)
    assert_problem(result, 429, "request.rate_limited")
    assert result.header("Retry-After") == "2"
    assert h.store.calls == []


def test_no_live_worker_accepting_the_version_is_503_and_changes_nothing() -> None:
    h = harness("contract.unsupported_version")
    h.store.workers = {"w-1": frozenset({2})}
    body = assert_problem(retry(h), 503, "contract.no_worker")
    assert body["acceptedVersions"] == [2]
    assert h.store.jobs["shipment-b-r"].state == "failed"


def test_the_retry_needs_a_key_and_is_post_only() -> None:
    h = harness()
    assert_problem(retry(h, key=None), 401, "auth.required")
    result = h.call("GET", "/api/imports/shipment-b-r/retry")
    assert_problem(result, 405, "request.method_not_allowed")
    assert result.header("Allow") == "POST"


# -- how the retry shows ---------------------------------------------------------------


def test_the_observer_and_the_cli_view_show_the_retry_event() -> None:
    event = {"id": "4-0", "event": "waiting", "jobId": "shipment-b", "batchId": "b", "attempt": 0, "data": {"retry": 2}}
    assert format_line(event) == "waiting shipment-b retry=2"
    assert format_line({**event, "data": {}}) == "waiting shipment-b"
    view = {"state": "failed", "attempt": 3, "progress": {"phase": "validated", "rows": 3}}
    assert apply_event(view, event) == {"state": "waiting", "attempt": 0, "progress": None}


def test_no_explanation_holds_a_placeholder() -> None:
    """Shown as they are (job records, `importer status`, the console): a literal
    '{jobId}' in a message told the reader nothing."""
    for code, (title, text) in EXPLANATIONS.items():
        assert not re.search(r"\{[A-Za-z]+\}", title + text), code
