"""A job's own event stream holds one entry per script call (common.lua, emit):
the call's earlier events ride in numbered fields, and each is given back on
its own, under its id in the global stream, in order. Their ids are implied
(consecutive, the entry's own the last) unless the entry names them."""

from __future__ import annotations

from importer.adapters.redis.records import stream_events, stream_id_key


def test_an_entry_of_one_call_gives_back_each_of_its_events_in_order() -> None:
    fields = {
        b"jobId": b"shipment-b1", b"batchId": b"b1", b"event": b"completed", b"attempt": b"1",
        b"data": b'{"imported":3,"batchId":"b1"}',
        b"id.1": b"1700000000000-4", b"event.1": b"active", b"attempt.1": b"1", b"data.1": b"{}",
        b"id.2": b"1700000000000-5", b"event.2": b"progress", b"attempt.2": b"1",
        b"data.2": b'{"phase":"validated","rows":3}',
        b"id.3": b"1700000000000-6", b"event.3": b"progress", b"attempt.3": b"1",
        b"data.3": b'{"phase":"committed","rows":3}',
    }
    events = stream_events("1700000000000-7", fields)
    assert [(e["id"], e["event"], e["data"].get("phase")) for e in events] == [
        ("1700000000000-4", "active", None),
        ("1700000000000-5", "progress", "validated"),
        ("1700000000000-6", "progress", "committed"),
        ("1700000000000-7", "completed", None),
    ]
    assert all(e["jobId"] == "shipment-b1" and e["batchId"] == "b1" and e["attempt"] == 1 for e in events)


def test_the_earlier_events_ids_are_implied_when_the_entry_does_not_name_them() -> None:
    fields = {
        b"jobId": b"shipment-b1", b"batchId": b"b1", b"event": b"completed", b"attempt": b"1",
        b"data": b'{"imported":3,"batchId":"b1"}',
        b"event.1": b"active", b"data.1": b"{}",
        b"event.2": b"progress", b"data.2": b'{"phase":"validated","rows":3}',
        b"event.3": b"progress", b"data.3": b'{"phase":"committed","rows":3}',
    }
    events = stream_events("1700000000000-7", fields)
    assert [(e["id"], e["event"], e["data"].get("phase"), e["attempt"]) for e in events] == [
        ("1700000000000-4", "active", None, 1),
        ("1700000000000-5", "progress", "validated", 1),
        ("1700000000000-6", "progress", "committed", 1),
        ("1700000000000-7", "completed", None, 1),
    ]
    # The first event of a millisecond's entries has sequence 0.
    (first, second) = stream_events("1700000000001-1", {
        b"event": b"active", b"attempt": b"2", b"data": b"{}", b"event.1": b"failed", b"attempt.1": b"1", b"data.1": b"{}",
    })
    assert [(e["id"], e["event"], e["attempt"]) for e in (first, second)] == [
        ("1700000000001-0", "failed", 1), ("1700000000001-1", "active", 2)]


def test_an_entry_of_one_event_reads_as_entries_always_did() -> None:
    fields = {b"jobId": b"shipment-b1", b"batchId": b"b1", b"event": b"waiting", b"attempt": b"0", b"data": b"{}"}
    (event,) = stream_events("1700000000000-0", fields)
    assert event == {"id": "1700000000000-0", "event": "waiting", "jobId": "shipment-b1", "batchId": "b1",
                     "attempt": 0, "data": {}}


def test_stream_ids_order_by_time_then_sequence_not_as_text() -> None:
    assert stream_id_key("1700000000000-10") > stream_id_key("1700000000000-9")
    assert stream_id_key("1700000000001-0") > stream_id_key("1700000000000-99")
