"""GET /api/imports (the caller's list) and GET /api/imports/{jobId}/events
(the live stream), through the real WSGI app with the typed fakes; and the
console's static files. No Redis, no network."""

from __future__ import annotations

import io
import json
from typing import Any
from wsgiref.util import setup_testing_defaults
from wsgiref.validate import validator

import pytest

from importer.domain.jobs import JobRecord
from importer.handlers.auth import KeyRing, hash_key
from importer.handlers.event_stream import EventStreams
from importer.handlers.query import JOB_ID, MILLIS, decode_cursor, encode_cursor
from importer.handlers.serverless import make_handler
from importer.handlers.wsgi import create_app
from tests.unit.fakes import NOW_MS
from tests.unit.test_http_handlers import KEY_A, KEY_B, Harness, assert_problem, make_harness


def rec(job_id: str, owner: str = "owner-a", state: str = "completed", created: int = NOW_MS, **kw: Any) -> JobRecord:
    return JobRecord(
        id=job_id, batch_id=job_id.removeprefix("shipment-"), owner=owner, state=state, attempt=1,
        progress={"phase": "committed", "rows": 3} if state == "completed" else None,
        result={"imported": 3, "batchId": job_id.removeprefix("shipment-")} if state == "completed" else None,
        error=None, created_at_ms=created, updated_at_ms=created, **kw,
    )


def ev(stream_id: str, kind: str, job_id: str = "shipment-a", attempt: int = 1, data: Any = None) -> dict[str, Any]:
    return {"id": stream_id, "event": kind, "jobId": job_id, "batchId": "a", "attempt": attempt, "data": data or {}}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def harness(**streams: Any) -> Harness:
    h = make_harness()
    h.api.event_streams = EventStreams(**streams)
    h.app = create_app(h.api, KeyRing.parse(f"owner-a:{hash_key(KEY_A)}\nowner-b:{hash_key(KEY_B)}"))
    return h


def stream_call(h: Harness, path: str, *, key: str = KEY_A, last_event_id: str | None = None) -> tuple[int, dict[str, str], bytes]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "GET", "SCRIPT_NAME": "", "PATH_INFO": path, "QUERY_STRING": "", "wsgi.input": io.BytesIO(b""),
    }
    environ["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    if last_event_id is not None:
        environ["HTTP_LAST_EVENT_ID"] = last_event_id
    setup_testing_defaults(environ)
    captured: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        captured.append((status, headers))
        return lambda data: None

    iterable = validator(h.app)(environ, start_response)
    try:
        body = b"".join(iterable)
    finally:
        iterable.close()
    status, headers = captured[0]
    return int(status.split()[0]), dict(headers), body


def sse_messages(body: bytes) -> list[dict[str, str]]:
    out = []
    for block in body.decode().split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line and not line.startswith(":") and ": " in line:
                name, value = line.split(": ", 1)
                fields[name] = value
        if "data" in fields:
            out.append(fields)
    return out


# -- the list ------------------------------------------------------------------


def test_list_shows_only_the_callers_imports_newest_first_in_pages() -> None:
    h = harness()
    for i in range(5):
        h.store.jobs[f"shipment-a{i}"] = rec(f"shipment-a{i}", created=NOW_MS + i)
    h.store.jobs["shipment-b"] = rec("shipment-b", owner="owner-b", created=NOW_MS + 10)

    first = h.call("GET", "/api/imports", query="limit=2")
    assert first.status == 200
    page = first.json()
    assert [item["id"] for item in page["items"]] == ["shipment-a4", "shipment-a3"]
    assert page["items"][0].keys() == h.call("GET", "/api/imports/shipment-a4").json().keys()
    seen = [item["id"] for item in page["items"]]
    while page["nextCursor"]:
        page = h.call("GET", "/api/imports", query=f"limit=2&cursor={page['nextCursor']}").json()
        seen += [item["id"] for item in page["items"]]
    assert seen == ["shipment-a4", "shipment-a3", "shipment-a2", "shipment-a1", "shipment-a0"]

    other = h.call("GET", "/api/imports", key=KEY_B).json()
    assert [item["id"] for item in other["items"]] == ["shipment-b"] and other["nextCursor"] is None


def test_list_filters_by_state() -> None:
    h = harness()
    h.store.jobs["shipment-x"] = rec("shipment-x", state="failed")
    h.store.jobs["shipment-y"] = rec("shipment-y", state="completed")
    body = h.call("GET", "/api/imports", query="state=failed").json()
    assert [item["id"] for item in body["items"]] == ["shipment-x"]


@pytest.mark.parametrize("query,field", [
    ("limit=0", "limit"), ("limit=101", "limit"), ("limit=x", "limit"),
    ("state=done", "state"), ("state=", "state"), ("limit=", "limit"), ("cursor=bm9wZQ", "cursor"), ("cursor=%25%25", "cursor"),
])
def test_list_refuses_bad_parameters_with_422(query: str, field: str) -> None:
    h = harness()
    body = assert_problem(h.call("GET", "/api/imports", query=query), 422, "request.invalid")
    assert field in body["fields"]


def test_list_needs_a_key() -> None:
    assert_problem(harness().call("GET", "/api/imports", key=None), 401, "auth.required")


def test_cursor_round_trip_is_opaque() -> None:
    cursor = encode_cursor((NOW_MS, "shipment-a.b@paris"))
    assert "shipment" not in cursor and decode_cursor(cursor, (MILLIS, JOB_ID)) == [NOW_MS, "shipment-a.b@paris"]
    assert decode_cursor("garbage!", (MILLIS, JOB_ID)) is None
    assert decode_cursor(encode_cursor((NOW_MS, "shipment-a:b")), (MILLIS, JOB_ID)) is None  # not a job id


# -- the event stream --------------------------------------------------------------


def test_stream_sends_stored_events_and_ends_after_the_final_one() -> None:
    h = harness()
    h.store.jobs["shipment-a"] = rec("shipment-a", state="active")
    h.store.events["shipment-a"] = [
        ev("1-0", "waiting", attempt=0), ev("2-0", "active"), ev("2-1", "progress", data={"phase": "validated", "rows": 3}),
        ev("2-2", "completed", data={"imported": 3, "batchId": "a"}),
    ]
    status, headers, body = stream_call(h, "/api/imports/shipment-a/events")
    assert status == 200
    assert headers["Content-Type"] == "text/event-stream; charset=utf-8"
    assert "Content-Length" not in headers and headers["X-Accel-Buffering"] == "no"
    messages = sse_messages(body)
    assert [(m["id"], m["event"]) for m in messages] == [("1-0", "waiting"), ("2-0", "active"), ("2-1", "progress"), ("2-2", "completed")]
    assert json.loads(messages[2]["data"])["data"] == {"phase": "validated", "rows": 3}
    assert h.api.event_streams.slots.open == 0


def test_a_retried_imports_stream_goes_on_past_its_earlier_failure_to_the_last_final_event() -> None:
    h = harness()
    h.store.jobs["shipment-a"] = rec("shipment-a", state="completed", retries=1)
    h.store.events["shipment-a"] = [
        ev("1-0", "waiting", attempt=0), ev("2-0", "active"), ev("3-0", "failed", data={"code": "import.time_limit"}),
        ev("4-0", "waiting", attempt=0, data={"retry": 1}), ev("5-0", "active"),
        ev("5-1", "completed", data={"imported": 3, "batchId": "a"}),
    ]
    _, _, body = stream_call(h, "/api/imports/shipment-a/events")
    assert [m["event"] for m in sse_messages(body)] == ["waiting", "active", "failed", "waiting", "active", "completed"]
    assert json.loads(sse_messages(body)[3]["data"])["data"] == {"retry": 1}


def test_a_stream_opened_on_a_failed_import_follows_its_retry_live() -> None:
    """The record read as failed, then retried before (or while) its history
    is replayed: the stream does not end at the earlier failure."""
    clock = FakeClock()
    h = harness(heartbeat_s=2.0, max_duration_s=30.0, block_s=1.0, clock=clock)
    h.store.jobs["shipment-a"] = rec("shipment-a", state="failed")
    h.store.events["shipment-a"] = [ev("1-0", "waiting", attempt=0), ev("3-0", "failed", data={"code": "import.time_limit"})]
    original = h.store.job_events

    def retried_meanwhile(job_id: str, after_id: str, block_ms: int | None) -> list[dict[str, object]]:
        if block_ms is None and after_id == "0-0":  # the replay: the retry happened just before it
            h.store.jobs["shipment-a"] = rec("shipment-a", state="waiting", retries=1)
            h.store.events["shipment-a"].append(ev("4-0", "waiting", attempt=0, data={"retry": 1}))
        elif block_ms:
            clock.now += block_ms / 1000
            h.store.events["shipment-a"] += [ev("5-0", "active"), ev("5-1", "completed", data={"imported": 3, "batchId": "a"})]
        return original(job_id, after_id, block_ms)

    h.store.job_events = retried_meanwhile  # type: ignore[method-assign]
    _, _, body = stream_call(h, "/api/imports/shipment-a/events")
    assert [m["id"] for m in sse_messages(body)] == ["1-0", "3-0", "4-0", "5-0", "5-1"]


def test_stream_resumes_after_last_event_id() -> None:
    h = harness()
    h.store.jobs["shipment-a"] = rec("shipment-a", state="completed")
    h.store.events["shipment-a"] = [ev("1-0", "waiting"), ev("2-0", "active"), ev("3-0", "completed")]
    _, _, body = stream_call(h, "/api/imports/shipment-a/events", last_event_id="2-0")
    assert [m["id"] for m in sse_messages(body)] == ["3-0"]


def test_another_owners_job_is_the_same_404_as_a_missing_one() -> None:
    h = harness()
    h.store.jobs["shipment-a"] = rec("shipment-a")
    other = h.call("GET", "/api/imports/shipment-a/events", key=KEY_B)
    missing = h.call("GET", "/api/imports/shipment-zz/events", key=KEY_B)
    assert_problem(other, 404, "job.not_found")
    assert other.body == missing.body == h.call("GET", "/api/imports/shipment-zz").body


def test_a_finished_job_without_stored_events_ends_with_its_final_state() -> None:
    h = harness()
    h.store.jobs["shipment-a"] = rec("shipment-a", state="completed")
    _, _, body = stream_call(h, "/api/imports/shipment-a/events")
    messages = sse_messages(body)
    assert [m["event"] for m in messages] == ["completed"] and "id" not in messages[0]


def test_quiet_stream_sends_heartbeats_and_ends_at_the_max_duration() -> None:
    clock = FakeClock()
    h = harness(heartbeat_s=2.0, max_duration_s=7.0, block_s=1.0, clock=clock)
    h.store.jobs["shipment-a"] = rec("shipment-a", state="active")
    original = h.store.job_events

    def waiting_events(job_id: str, after_id: str, block_ms: int | None) -> list[dict[str, object]]:
        if block_ms:
            assert block_ms <= 1000
            clock.now += block_ms / 1000
        return original(job_id, after_id, block_ms)

    h.store.job_events = waiting_events  # type: ignore[method-assign]
    _, _, body = stream_call(h, "/api/imports/shipment-a/events")
    text = body.decode()
    assert text.count(": heartbeat") == 3
    assert text.endswith(": max duration reached, reconnect with Last-Event-ID\n\n")
    assert h.api.event_streams.slots.open == 0


def test_one_stream_more_than_the_limit_is_503_busy_and_a_closed_one_frees_its_slot() -> None:
    h = harness(limit=1)
    h.store.jobs["shipment-a"] = rec("shipment-a", state="active")
    assert h.api.event_streams.slots.try_acquire()  # one stream already open
    busy = h.call("GET", "/api/imports/shipment-a/events")
    assert_problem(busy, 503, "service.busy")
    assert busy.header("Retry-After") == "5"
    h.api.event_streams.slots.release()
    h.store.events["shipment-a"] = [ev("1-0", "failed", data={"code": "csv.bad_row"})]
    status, _, _ = stream_call(h, "/api/imports/shipment-a/events")
    assert status == 200 and h.api.event_streams.slots.open == 0


def test_the_serverless_transport_answers_501_and_frees_the_slot() -> None:
    h = harness(limit=1)
    h.store.jobs["shipment-a"] = rec("shipment-a", state="active")
    handle = make_handler(h.api, KeyRing.parse(f"owner-a:{hash_key(KEY_A)}"))
    event = {
        "rawPath": "/api/imports/shipment-a/events", "rawQueryString": "",
        "headers": {"authorization": f"Bearer {KEY_A}"},
        "requestContext": {"http": {"method": "GET"}},
    }
    answer = handle(event, None)
    assert answer["statusCode"] == 501 and json.loads(answer["body"])["code"] == "request.stream_unsupported"
    assert h.api.event_streams.slots.open == 0


# -- the console's files --------------------------------------------------------------


@pytest.mark.parametrize("path,ctype", [
    ("/", "text/html; charset=utf-8"), ("/console.js", "text/javascript; charset=utf-8"),
    ("/console.css", "text/css; charset=utf-8"),
])
def test_console_files_are_served_with_a_strict_csp(path: str, ctype: str) -> None:
    result = harness().call("GET", path, key=None)
    assert result.status == 200 and result.header("Content-Type") == ctype
    assert result.header("Content-Security-Policy").startswith("default-src 'self'")
    assert result.header("X-Content-Type-Options") == "nosniff"
    text = result.body.decode()
    assert "http://" not in text and "https://" not in text  # nothing from elsewhere


def test_the_page_has_no_inline_script_or_style_and_keeps_the_key_out_of_urls() -> None:
    h = harness()
    html = h.call("GET", "/", key=None).body.decode()
    assert "<script>" not in html and "style=" not in html and "<style" not in html
    js = h.call("GET", "/console.js", key=None).body.decode()
    assert "sessionStorage.setItem" in js and "localStorage.setItem" not in js and "new EventSource" not in js
