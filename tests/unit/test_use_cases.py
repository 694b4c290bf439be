"""The two use cases over small fakes of their ports: submit_import and run_import."""

from __future__ import annotations

import logging

import pytest

from importer.domain.contract import encode_message
from importer.domain.run_import import PermanentImportFailure, run_import
from importer.domain.errors import BatchConflict
from importer.domain.submit_import import Upload, submit_import, submit_imports
from importer.domain.jobs import ShipmentRecord
from importer.domain.shipment import content_key
from tests.unit.fakes import EventRecorder, FakeAttemptStore, FakeSender, FakeStore

CSV = b"sku,quantity\nA-1,3\nB-2,4\n"
UPLOAD = "0" * 32


def submit(store: FakeStore, sender: FakeSender, *, owner: str = "owner-a", batch_id: str = "b-1", csv: bytes = CSV) -> object:
    return submit_import(store, sender, owner=owner, batch_id=batch_id, csv=csv, upload_id=UPLOAD, max_rows=100)


def test_submit_records_then_sends_then_marks_sent_once() -> None:
    store, sender = FakeStore(), FakeSender()

    first = submit(store, sender)
    again = submit(store, sender, csv=b"sku,quantity\r\nB-2,4\r\nA-1,3\r\n")  # same rows, other order and endings

    assert (first.job_id, first.state) == ("shipment-b-1", "waiting")  # type: ignore[attr-defined]
    assert again == first
    assert [m.job_id for m in sender.sent] == ["shipment-b-1"]
    # Other bytes: the contents are compared, the stored upload's read once.
    assert store.calls == ["enqueue", "mark_sent", "enqueue", "read_upload", "enqueue"]


def test_submit_imports_answers_each_as_submit_import_would_and_stops_calling_a_failed_transport() -> None:
    store, sender = FakeStore(), FakeSender()
    submit(store, sender, batch_id="b-known")
    store.calls.clear()
    later: list[tuple[str, str, str]] = []
    uploads = [
        Upload("b-new", CSV, "1" * 32, send_later=True),
        Upload("b-known", b"sku,quantity\nA-1,9\n", "2" * 32),  # other content: a conflict
        Upload("b-big", CSV, "3" * 32),  # sent on its own: the transport fails
        Upload("b-big-2", CSV, "4" * 32),  # would be sent too: not tried
        Upload("b-known", b"sku,quantity\nB-2,4\nA-1,3\n", "5" * 32),  # the same rows: needs more calls, not tried
        Upload("b-new", CSV, "6" * 32, send_later=True),  # the same bytes again: its job, no call more
    ]
    sender.send = _failing  # type: ignore[method-assign]

    got = submit_imports(store, sender, uploads, owner="owner-a", max_rows=100, send_later=later)

    assert [type(r).__name__ for r in got] == [
        "Accepted", "BatchConflict", "ConnectionError", "ConnectionError", "ConnectionError", "Accepted"]
    assert got[2] is got[3] is got[4]  # the same failure, the others not tried
    assert later == [("shipment-b-new", "b-new", "1" * 32)]  # recorded, for the caller to send in a group
    assert store.calls == ["enqueue"] * 6 + ["read_upload", "enqueue"]  # every first step (enqueue_many), then b-known's content
    assert "mark_sent" not in store.calls


def _failing(**_: object) -> None:
    raise ConnectionError("the broker is away")


def test_submit_hashes_only_the_bytes_of_a_new_batch_and_of_a_retry() -> None:
    store, sender = FakeStore(sends_with_record=True), FakeSender()

    first = submit(store, sender)
    retry = submit(store, sender)  # the same bytes

    assert retry == first
    assert store.calls == ["enqueue", "enqueue"]  # one store call per POST, no content key asked for
    assert store.jobs["shipment-b-1"].content_sha256 == ""  # computed only when needed


def test_submit_compares_contents_once_and_keeps_the_stored_key() -> None:
    store, sender = FakeStore(sends_with_record=True), FakeSender()
    submit(store, sender)
    reordered = b"sku,quantity\nB-2,4\nA-1,3\n"

    assert submit(store, sender, csv=reordered).state == "waiting"  # type: ignore[attr-defined]
    assert store.jobs["shipment-b-1"].content_sha256 == content_key(CSV, 100)  # kept in the record
    store.calls.clear()
    assert submit(store, sender, csv=b"sku,quantity\r\nA-1,3\r\nB-2,4\r\n").state == "waiting"  # type: ignore[attr-defined]
    assert store.calls == ["enqueue", "enqueue"]  # the stored upload is not read again
    with pytest.raises(BatchConflict):
        submit(store, sender, csv=b"sku,quantity\nB-2,4\nA-1,4\n")


def test_submit_after_retention_compares_with_the_done_marker() -> None:
    store, sender = FakeStore(sends_with_record=True), FakeSender()
    store.shipments["b-1"] = ShipmentRecord("b-1", "owner-a", 1, {"imported": 2, "batchId": "b-1"}, content_key(CSV, 100), "shipment-b-1")

    replay = submit(store, sender, csv=b"sku,quantity\nB-2,4\nA-1,3\n")  # the applied rows, reordered: a replay job

    assert replay.state == "waiting"  # type: ignore[attr-defined]
    assert store.calls == ["enqueue", "enqueue"]
    del store.jobs["shipment-b-1"]
    with pytest.raises(BatchConflict):
        submit(store, sender, csv=b"sku,quantity\nA-1,9\n")


def test_submit_sends_nothing_when_the_store_wrote_the_message_with_the_record() -> None:
    store, sender = FakeStore(sends_with_record=True), FakeSender()

    accepted = submit(store, sender)
    submit(store, sender)

    assert (accepted.job_id, accepted.state) == ("shipment-b-1", "waiting")  # type: ignore[attr-defined]
    assert sender.sent == []
    assert store.calls == ["enqueue", "enqueue"]  # one store call per POST, no mark_sent


def test_submit_refuses_other_content_and_other_owners_alike() -> None:
    store, sender = FakeStore(), FakeSender()
    submit(store, sender)

    with pytest.raises(BatchConflict) as other_content:
        submit(store, sender, csv=b"sku,quantity\nA-1,5\n")
    with pytest.raises(BatchConflict) as other_owner:
        submit(store, sender, owner="owner-b")

    assert other_content.value.code == other_owner.value.code == "batch.conflict"
    assert len(sender.sent) == 1


def test_run_applies_once_and_skips_a_redelivery() -> None:
    store, log = FakeAttemptStore(CSV), EventRecorder()
    body = encode_message("shipment-b-1", "b-1", UPLOAD)
    started: list[tuple[str, int]] = []

    first = run_import(store, body, accepted_versions=frozenset({1}), max_rows=100, log=log, on_started=lambda j, a, t: started.append((j, a)))
    second = run_import(store, body, accepted_versions=frozenset({1}), max_rows=100, log=log)

    assert (first, second) == ("applied", "finished")
    assert store.applied == ["b-1"] and started == [("shipment-b-1", 1)]
    assert [e for e, _ in log.events] == ["import.started", "import.applied", "import.skipped"]


def test_an_applied_import_is_a_debug_line_and_a_replayed_one_an_info_line() -> None:
    """The line of every import that went as it should stays below the default
    level (IMPORTER_LOG_LEVEL=debug shows it); one whose batch had been applied
    already (a send twice, the done marker held) is shown."""
    log = EventRecorder()
    run_import(FakeAttemptStore(CSV), encode_message("shipment-b-1", "b-1", UPLOAD), accepted_versions=frozenset({1}),
               max_rows=100, log=log)
    run_import(FakeAttemptStore(CSV, applied=["b-1"]), encode_message("shipment-b-1", "b-1", UPLOAD),
               accepted_versions=frozenset({1}), max_rows=100, log=log)

    assert [e for e, _ in log.events] == ["import.started", "import.applied", "import.started", "import.replayed"]
    assert (log.levels["import.applied"], log.levels["import.replayed"]) == (logging.DEBUG, logging.INFO)


def test_run_fails_invalid_csv_permanently_with_the_first_issue_code() -> None:
    store = FakeAttemptStore(b"sku,quantity\nA-1,abc\n")

    with pytest.raises(PermanentImportFailure) as failed:
        run_import(store, encode_message("shipment-b-1", "b-1", UPLOAD), accepted_versions=frozenset({1}), max_rows=100, log=EventRecorder())

    assert failed.value.code == "csv.bad_quantity"
    assert store.failures == [("csv.bad_quantity", True)] and store.applied == []


def test_run_with_the_upload_handed_over_validates_first_then_runs_one_store_step() -> None:
    store, log = FakeAttemptStore(b"never read: the upload came with the message"), EventRecorder()
    body = encode_message("shipment-b-1", "b-1", UPLOAD)
    started: list[tuple[str, int]] = []

    first = run_import(store, body, accepted_versions=frozenset({1}), max_rows=100, log=log,
                       on_started=lambda j, a, t: started.append((j, a)), upload=CSV)
    again = run_import(store, body, accepted_versions=frozenset({1}), max_rows=100, log=log, upload=CSV)

    assert (first, again) == ("applied", "finished")
    assert store.calls == ["start_and_apply", "start_and_apply"] and store.applied == ["b-1"]
    # The attempt is over when the step returns: no lease to renew, nothing to record on a crash.
    assert started == []
    assert [e for e, _ in log.events] == ["import.started", "import.applied", "import.skipped"]
    assert log.events[1][1]["rows"] == 2


def test_run_with_an_invalid_upload_handed_over_takes_the_separate_steps_to_fail() -> None:
    bad = b"sku,quantity\nA-1,abc\n"
    store = FakeAttemptStore(bad)

    with pytest.raises(PermanentImportFailure) as failed:
        run_import(store, encode_message("shipment-b-1", "b-1", UPLOAD), accepted_versions=frozenset({1}),
                   max_rows=100, log=EventRecorder(), upload=bad)

    assert failed.value.code == "csv.bad_quantity"
    assert store.calls == ["start", "fail"] and store.failures == [("csv.bad_quantity", True)]


def test_run_fails_an_unsupported_version_without_starting() -> None:
    store = FakeAttemptStore(CSV)
    body = {**encode_message("shipment-b-1", "b-1", UPLOAD), "version": 2}

    with pytest.raises(PermanentImportFailure) as failed:
        run_import(store, body, accepted_versions=frozenset({1}), max_rows=100, log=EventRecorder())

    assert failed.value.code == "contract.unsupported_version"
    assert store.attempt == 0 and store.failures == [("contract.unsupported_version", True)]
