"""The HTTP API through the real WSGI app (handlers/wsgi.py), in process.

No network and no Redis: the ports of :class:`importer.handlers.api.Api` are the small
typed fakes of tests/unit/fakes.py (a dict-backed JobStore and a list-backed MessageSender).
Every call goes through ``wsgiref.validate.validator`` so the app is also
checked against PEP 3333 on each request.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any
from wsgiref.util import is_hop_by_hop, setup_testing_defaults
from wsgiref.validate import validator

import pytest

from importer.domain.jobs import JobRecord, ShipmentRecord
from importer.handlers.api import Api, Lifecycle
from importer.handlers.auth import KeyRing, hash_key
from importer.handlers.http import PROBLEM_TYPE_BASE
from importer.handlers.schemas import JobAcceptedSchema
from importer.handlers.wsgi import WsgiApp, body_limit, create_app
from tests.unit.fakes import NOW_MS, CountingUuids, FakeSender, FakeStore, SentMessage, StoreDown

KEY_A = "imp_test-key-for-owner-a"
KEY_B = "imp_test-key-for-owner-b"
MAX_UPLOAD_BYTES = 1024

VALID_CSV = "sku,quantity\nWIDGET-RED-01,10\nGADGET-BLU-02,25\n"
OTHER_CSV = "sku,quantity\nWIDGET-RED-01,11\n"

STATUS_FIELDS = frozenset({
    "id", "batchId", "location", "state", "attempt", "progress", "result", "error",
    "createdAt", "updatedAt", "startedAt", "finishedAt", "nextAttemptAt", "retries", "retryable",
})
PROBLEM_MEMBERS = frozenset({"type", "title", "status", "detail", "code"})


class ExplodingStream:
    """A wsgi.input that fails the test if anything reads it."""

    def read(self, *args: Any) -> bytes:
        raise AssertionError("wsgi.input must not be read")

    def readline(self, *args: Any) -> bytes:
        raise AssertionError("wsgi.input must not be read")

    def readlines(self, *args: Any) -> list[bytes]:
        raise AssertionError("wsgi.input must not be read")

    def __iter__(self) -> Iterator[bytes]:
        raise AssertionError("wsgi.input must not be read")


# -- harness ----------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k.lower() == name.lower()]
        assert len(values) <= 1, f"header {name} repeated: {values}"
        return values[0] if values else None

    def json(self) -> Any:
        return json.loads(self.body)


def call_wsgi(
    app: WsgiApp,
    method: str,
    path: str,
    *,
    query: str = "",
    body: bytes = b"",
    content_type: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    stream: Any = None,
    content_length: str | None = None,
    validate: bool = True,
    extra_environ: dict[str, Any] | None = None,
) -> Result:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "wsgi.input": stream if stream is not None else io.BytesIO(body),
    }
    if content_length is not None:
        environ["CONTENT_LENGTH"] = content_length
    elif body:
        environ["CONTENT_LENGTH"] = str(len(body))
    if content_type is not None:
        environ["CONTENT_TYPE"] = content_type
    for name, value in headers:
        environ["HTTP_" + name.upper().replace("-", "_")] = value
    setup_testing_defaults(environ)
    environ.update(extra_environ or {})

    captured: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(status: str, response_headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        captured.append((status, response_headers))
        return lambda data: None

    wrapped = validator(app) if validate else app
    iterable = wrapped(environ, start_response)
    try:
        payload = b"".join(iterable)
    finally:
        close = getattr(iterable, "close", None)
        if close is not None:
            close()
    assert len(captured) == 1
    status_line, response_headers = captured[0]
    result = Result(int(status_line.split(" ", 1)[0]), tuple(response_headers), payload)
    if method != "HEAD":  # a HEAD answer has the GET answer's Content-Length and no body
        assert result.header("Content-Length") == str(len(payload))
    return result


@dataclass
class Harness:
    api: Api
    store: FakeStore
    sender: FakeSender
    uuids: CountingUuids
    app: WsgiApp

    def call(self, method: str, path: str, *, key: str | None = KEY_A, **kwargs: Any) -> Result:
        extra = list(kwargs.pop("headers", ()))
        if key is not None:
            extra.append(("Authorization", f"Bearer {key}"))
        return call_wsgi(self.app, method, path, headers=extra, **kwargs)

    def post_json(self, payload: Any, *, key: str | None = KEY_A, **kwargs: Any) -> Result:
        return self.call(
            "POST", "/api/imports", key=key, body=json.dumps(payload).encode(), content_type="application/json", **kwargs
        )

    def post_csv(self, csv: bytes | str, batch_id: str | None, *, key: str | None = KEY_A, **kwargs: Any) -> Result:
        data = csv.encode() if isinstance(csv, str) else csv
        query = "" if batch_id is None else f"batchId={batch_id}"
        kwargs.setdefault("content_type", "text/csv")
        return self.call("POST", "/api/imports", key=key, query=query, body=data, **kwargs)

    def get_job(self, job_id: str, *, key: str | None = KEY_A) -> Result:
        return self.call("GET", f"/api/imports/{job_id}", key=key)


def make_harness(
    *, unavailable: tuple[type[BaseException], ...] = (StoreDown,), max_upload_bytes: int = MAX_UPLOAD_BYTES,
) -> Harness:
    store, sender, uuids = FakeStore(), FakeSender(), CountingUuids()
    api = Api(
        store=store,
        sender=sender,
        max_upload_bytes=max_upload_bytes,
        max_rows=1000,
        openapi_yaml=lambda: "openapi: 3.0.3\n",
        uuidgen=uuids,
        unavailable_errors=unavailable,
        lifecycle=Lifecycle(),
    )
    keys = KeyRing.parse(f"owner-a:{hash_key(KEY_A)}\nowner-b:{hash_key(KEY_B)}")
    return Harness(api, store, sender, uuids, create_app(api, keys))


@pytest.fixture
def h() -> Harness:
    return make_harness()


def assert_problem(result: Result, status: int, code: str) -> dict[str, Any]:
    """Every problem: its media type, the RFC 9457 members, status equal to the HTTP status."""
    assert result.status == status, result.body
    assert result.header("Content-Type") == "application/problem+json"
    body = result.json()
    assert isinstance(body, dict)
    assert PROBLEM_MEMBERS <= body.keys(), body
    assert body["status"] == status
    assert body["code"] == code
    assert body["type"] == PROBLEM_TYPE_BASE + code
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    return body


def without_request_id(headers: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The headers but X-Request-Id (a new random id on every answer)."""
    return tuple((name, value) for name, value in headers if name != "X-Request-Id")


def record(**overrides: Any) -> JobRecord:
    base = JobRecord(
        id="shipment-b-full", batch_id="b-full", owner="owner-a", state="completed", attempt=2,
        progress={"phase": "committed", "rows": 3, "workerHost": "worker-7.internal"},
        result={"imported": 3, "batchId": "b-full", "replay": False, "lockToken": "tok-123"},
        error=None,
        created_at_ms=NOW_MS, updated_at_ms=NOW_MS + 5000,
        started_at_ms=NOW_MS + 1000, finished_at_ms=NOW_MS + 5000, next_attempt_at_ms=None,
        content_sha256="f" * 64, upload_id="a" * 32,
    )
    return replace(base, **overrides)


def shipment(**overrides: Any) -> ShipmentRecord:
    base = ShipmentRecord(
        batch_id="b-done", owner="owner-a", applied_at_ms=NOW_MS + 5000,
        result={"imported": 3, "batchId": "b-done"}, content_sha256="c" * 64, job_id="shipment-b-done",
    )
    return replace(base, **overrides)


def iso(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


# -- POST /api/imports ------------------------------------------------------


def test_enqueue_json_is_accepted_and_sends_one_message(h: Harness) -> None:
    result = h.post_json({"batchId": "b-1", "csv": VALID_CSV})

    assert result.status == 202
    assert result.header("Content-Type") == "application/json"
    assert result.json() == {"jobId": "shipment-b-1", "batchId": "b-1", "location": "main", "state": "waiting"}
    # The handler writes the answer without the schema: it is exactly what the schema dumps.
    assert JobAcceptedSchema().validate(result.json()) == {}
    assert JobAcceptedSchema().dump(result.json()) == result.json()
    assert result.header("Location") == "/api/imports/shipment-b-1"
    assert h.sender.sent == [SentMessage("shipment-b-1", "b-1", h.uuids.issued[0])]
    assert h.store.marked_sent == ["shipment-b-1"]
    stored = h.store.jobs["shipment-b-1"]
    assert (stored.owner, stored.upload_id) == ("owner-a", h.uuids.issued[0])
    assert h.store.uploads[stored.upload_id] == VALID_CSV.encode()


@pytest.mark.parametrize("content_type", ["text/csv", "text/csv; charset=utf-8", "application/csv", "TEXT/CSV"])
def test_enqueue_csv_body_with_batch_id_in_query(h: Harness, content_type: str) -> None:
    result = h.post_csv(VALID_CSV, "b-2", content_type=content_type)

    assert result.status == 202
    assert result.json() == {"jobId": "shipment-b-2", "batchId": "b-2", "location": "main", "state": "waiting"}
    assert result.header("Location") == "/api/imports/shipment-b-2"
    assert h.sender.sent == [SentMessage("shipment-b-2", "b-2", h.uuids.issued[0])]
    assert h.store.uploads[h.uuids.issued[0]] == VALID_CSV.encode()


@pytest.mark.parametrize("transport", ["json", "csv"])
def test_identical_second_post_returns_the_same_job_and_sends_nothing(h: Harness, transport: str) -> None:
    def post() -> Result:
        if transport == "json":
            return h.post_json({"batchId": "b-3", "csv": VALID_CSV})
        return h.post_csv(VALID_CSV, "b-3")

    first, second = post(), post()

    assert first.status == second.status == 202
    assert second.body == first.body
    assert second.header("Location") == first.header("Location") == "/api/imports/shipment-b-3"
    assert len(h.sender.sent) == 1
    assert h.store.marked_sent == ["shipment-b-3"]


def test_same_shipment_in_the_other_format_or_line_endings_is_the_same_job(h: Harness) -> None:
    assert h.post_json({"batchId": "b-4", "csv": VALID_CSV}).status == 202
    again = h.post_csv(VALID_CSV.replace("\n", "\r\n"), "b-4")

    assert again.status == 202
    assert again.json()["jobId"] == "shipment-b-4"
    assert len(h.sender.sent) == 1


def test_exists_reports_the_stored_state(h: Harness) -> None:
    assert h.post_json({"batchId": "b-5", "csv": VALID_CSV}).status == 202
    h.store.jobs["shipment-b-5"] = replace(h.store.jobs["shipment-b-5"], state="active")

    again = h.post_json({"batchId": "b-5", "csv": VALID_CSV})

    assert again.status == 202
    assert again.json() == {"jobId": "shipment-b-5", "batchId": "b-5", "location": "main", "state": "active"}
    assert len(h.sender.sent) == 1


def test_other_content_or_other_owner_is_a_conflict_and_reveals_nothing(h: Harness) -> None:
    assert h.post_json({"batchId": "b-6", "csv": VALID_CSV}).status == 202

    other_content = h.post_json({"batchId": "b-6", "csv": OTHER_CSV})
    other_owner = h.post_json({"batchId": "b-6", "csv": VALID_CSV}, key=KEY_B)

    assert_problem(other_content, 409, "batch.conflict")
    assert_problem(other_owner, 409, "batch.conflict")
    assert other_owner.body == other_content.body
    assert len(h.sender.sent) == 1
    assert h.store.jobs["shipment-b-6"].owner == "owner-a"


def test_invalid_csv_content_is_still_accepted_for_the_worker_to_fail(h: Harness) -> None:
    bad = "sku,quantity\nWIDGET-RED-01,lots\n"
    result = h.post_csv(bad, "b-7")

    assert result.status == 202
    # Its content key is not computed for a new batch, only its bytes' hash...
    assert h.store.jobs["shipment-b-7"].content_sha256 == ""
    assert h.store.raw_hashes["shipment-b-7"] == hashlib.sha256(bad.encode()).hexdigest()
    # ... and an invalid file's content is its bytes: the same bytes again are the same job, a fixed file is other content.
    assert h.post_csv(bad, "b-7").status == 202
    assert_problem(h.post_csv(VALID_CSV, "b-7"), 409, "batch.conflict")
    assert h.store.jobs["shipment-b-7"].content_sha256.startswith("bytes:")
    assert len(h.sender.sent) == 1


# -- authentication -------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer imp_not-a-configured-key",
        "Bearer ",
        "Bearer",
        f"Basic {KEY_A}",
        f"Token {KEY_A}",
        KEY_A,
    ],
    ids=["no-header", "wrong-key", "empty-token", "scheme-only", "basic", "token-scheme", "bare-key"],
)
@pytest.mark.parametrize("method,path", [("POST", "/api/imports"), ("GET", "/api/imports/shipment-b-1")])
def test_missing_or_unknown_key_is_401(h: Harness, authorization: str | None, method: str, path: str) -> None:
    headers = [] if authorization is None else [("Authorization", authorization)]
    body = json.dumps({"batchId": "b-1", "csv": VALID_CSV}).encode() if method == "POST" else b""

    result = h.call(
        method, path, key=None, headers=headers, body=body, content_type="application/json" if body else None
    )

    assert_problem(result, 401, "auth.invalid" if authorization == "Bearer imp_not-a-configured-key" else "auth.required")
    assert result.header("WWW-Authenticate") == 'Bearer realm="importer"'
    assert h.store.calls == []
    assert h.sender.sent == []


def test_bearer_scheme_is_case_insensitive(h: Harness) -> None:
    result = h.call(
        "POST", "/api/imports", key=None, headers=[("Authorization", f"bearer {KEY_A}")],
        body=json.dumps({"batchId": "b-8", "csv": VALID_CSV}).encode(), content_type="application/json",
    )
    assert result.status == 202


def test_health_and_spec_need_no_key(h: Harness) -> None:
    health = h.call("GET", "/health", key=None)
    spec = h.call("GET", "/openapi.yaml", key=None)

    assert health.status == 200
    assert spec.status == 200
    assert spec.header("Content-Type") == "application/yaml"
    assert spec.body == h.api.openapi_yaml().encode()


# -- request validation -------------------------------------------------------


@pytest.mark.parametrize("body", [b"{not json", b"", b'{"batchId": "b-1", "csv": "\xff"}'], ids=["syntax", "empty", "not-utf8"])
def test_body_that_is_not_json_is_400(h: Harness, body: bytes) -> None:
    result = h.call("POST", "/api/imports", body=body, content_type="application/json")

    problem = assert_problem(result, 400, "request.bad_json")
    assert problem["instance"] == "/api/imports"
    assert h.store.calls == []


@pytest.mark.parametrize(
    "payload,field_name",
    [
        ({"batchId": "b-1"}, "csv"),
        ({"csv": VALID_CSV}, "batchId"),
        ({"batchId": "bad id!", "csv": VALID_CSV}, "batchId"),
        ({"batchId": "-leading-dash", "csv": VALID_CSV}, "batchId"),
        ({"batchId": "x" * 65, "csv": VALID_CSV}, "batchId"),
        ({"batchId": 42, "csv": VALID_CSV}, "batchId"),
        ({"batchId": "b-1", "csv": None}, "csv"),
        ({"batchId": "b-1", "csv": VALID_CSV, "owner": "owner-b"}, "owner"),
        ([{"batchId": "b-1", "csv": VALID_CSV}], "_schema"),
        ("just a string", "_schema"),
    ],
    ids=[
        "missing-csv", "missing-batchId", "bad-batchId", "leading-dash", "too-long", "non-string-batchId",
        "null-csv", "unknown-field", "array-body", "string-body",
    ],
)
def test_invalid_json_fields_are_422(h: Harness, payload: Any, field_name: str) -> None:
    result = h.post_json(payload)

    problem = assert_problem(result, 422, "request.invalid")
    assert problem["instance"] == "/api/imports"
    assert field_name in problem["fields"]
    assert all(isinstance(m, str) for messages in problem["fields"].values() for m in messages)
    assert h.store.calls == []
    assert h.sender.sent == []


@pytest.mark.parametrize("batch_id", [None, "", "bad%20id", "a/b", "x" * 65, "abc%0A"])
def test_csv_body_without_a_valid_batch_id_is_422(h: Harness, batch_id: str | None) -> None:
    result = h.post_csv(VALID_CSV, batch_id)

    problem = assert_problem(result, 422, "request.invalid")
    assert list(problem["fields"]) == ["batchId"]
    assert h.store.calls == []


def test_json_batch_id_with_trailing_newline_is_422(h: Harness) -> None:
    # Unvalidated call: with the bug the Location header carries a raw newline,
    # which the WSGI validator (rightly) refuses outright.
    result = h.post_json({"batchId": "abc\n", "csv": VALID_CSV}, validate=False)

    assert_problem(result, 422, "request.invalid")
    assert h.sender.sent == []


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonx"]
)
def test_other_content_types_are_415(h: Harness, content_type: str | None) -> None:
    result = h.call("POST", "/api/imports", body=VALID_CSV.encode(), content_type=content_type, query="batchId=b-1")

    problem = assert_problem(result, 415, "request.unsupported_media_type")
    assert problem["instance"] == "/api/imports"
    assert h.store.calls == []


def test_content_length_over_the_limit_is_413_without_reading_the_body(h: Harness) -> None:
    too_long = body_limit(h.api) + 1

    result = h.call(
        "POST", "/api/imports", stream=ExplodingStream(), content_length=str(too_long), content_type="application/json"
    )

    assert_problem(result, 413, "request.too_large")
    assert h.store.calls == []


def test_too_large_response_carries_no_hop_by_hop_header(h: Harness) -> None:
    result = h.call(
        "POST", "/api/imports", stream=ExplodingStream(),
        content_length=str(body_limit(h.api) + 1), content_type="application/json",
    )
    assert result.status == 413
    assert [name for name, _ in result.headers if is_hop_by_hop(name)] == []


def test_content_length_over_the_limit_is_413_even_without_a_key(h: Harness) -> None:
    result = h.call(
        "POST", "/api/imports", key=None, stream=ExplodingStream(),
        content_length=str(10 * body_limit(h.api)), content_type="text/csv",
    )
    assert_problem(result, 413, "request.too_large")


def test_body_without_content_length_is_cut_at_the_limit(h: Harness) -> None:
    limit = body_limit(h.api)
    stream = io.BytesIO(b"x" * (limit + 10))

    result = h.call("POST", "/api/imports", query="batchId=b-1", stream=stream, content_type="text/csv")

    assert_problem(result, 413, "request.too_large")
    assert stream.tell() <= limit + 64 * 1024  # stopped reading at the first chunk past the limit
    assert h.store.calls == []


@pytest.mark.parametrize("transport", ["json", "csv"])
def test_csv_larger_than_max_upload_bytes_is_413(h: Harness, transport: str) -> None:
    csv = "sku,quantity\n" + "x" * (MAX_UPLOAD_BYTES + 1 - len("sku,quantity\n"))
    assert len(csv.encode()) == MAX_UPLOAD_BYTES + 1
    assert len(json.dumps({"batchId": "b-9", "csv": csv})) <= body_limit(h.api)  # passes the transport limit

    result = h.post_json({"batchId": "b-9", "csv": csv}) if transport == "json" else h.post_csv(csv, "b-9")

    problem = assert_problem(result, 413, "request.too_large")
    assert problem["instance"] == "/api/imports"
    assert h.store.calls == []
    assert h.sender.sent == []


def test_csv_measured_in_utf8_bytes_for_the_limit(h: Harness) -> None:
    # 'é' is one character but two bytes: the limit is about bytes.
    csv = "é" * (MAX_UPLOAD_BYTES // 2 + 1)
    assert len(csv) <= MAX_UPLOAD_BYTES < len(csv.encode())

    assert_problem(h.post_json({"batchId": "b-10", "csv": csv}), 413, "request.too_large")


@pytest.mark.parametrize("transport", ["json", "csv"])
def test_csv_of_exactly_max_upload_bytes_is_accepted(h: Harness, transport: str) -> None:
    csv = "sku,quantity\n" + "x" * (MAX_UPLOAD_BYTES - len("sku,quantity\n"))
    assert len(csv.encode()) == MAX_UPLOAD_BYTES

    result = h.post_json({"batchId": "b-11", "csv": csv}) if transport == "json" else h.post_csv(csv, "b-11")

    assert result.status == 202


# -- GET /api/imports/{jobId} ---------------------------------------------------


def test_owner_reads_a_new_job(h: Harness) -> None:
    assert h.post_json({"batchId": "b-12", "csv": VALID_CSV}).status == 202

    result = h.get_job("shipment-b-12")

    assert result.status == 200
    assert result.header("Content-Type") == "application/json"
    body = result.json()
    assert body.keys() == STATUS_FIELDS
    assert body["id"] == "shipment-b-12"
    assert body["batchId"] == "b-12"
    assert body["state"] == "waiting"
    assert body["attempt"] == 0
    assert body["progress"] is None and body["result"] is None and body["error"] is None
    assert datetime.fromisoformat(body["createdAt"]) == iso(NOW_MS)
    assert datetime.fromisoformat(body["updatedAt"]) == iso(NOW_MS)
    assert body["startedAt"] is None and body["finishedAt"] is None and body["nextAttemptAt"] is None


def test_status_shows_allow_listed_fields_only(h: Harness) -> None:
    h.store.jobs["shipment-b-full"] = record()

    result = h.get_job("shipment-b-full")

    assert result.status == 200
    body = result.json()
    assert body.keys() == STATUS_FIELDS
    assert body["progress"] == {"phase": "committed", "rows": 3}
    assert body["result"] == {"imported": 3, "batchId": "b-full", "replay": False}
    assert datetime.fromisoformat(body["startedAt"]) == iso(NOW_MS + 1000)
    assert datetime.fromisoformat(body["finishedAt"]) == iso(NOW_MS + 5000)
    for private in (b"owner-a", b"f" * 64, b"a" * 32, b"worker-7", b"tok-123", b"owner", b"upload", b"content"):
        assert private not in result.body


def test_status_of_a_failed_job_shows_the_public_error_only(h: Harness) -> None:
    error = {
        "code": "csv.bad_quantity",
        "message": "A quantity is a whole number from 1 to 1000000, digits only.",
        "issues": [{"line": 2, "column": 2, "code": "csv.bad_quantity", "message": "bad", "raw": "lots"}],
        "issuesTruncated": False,
        "traceback": "Traceback (most recent call last): /srv/app.py",
    }
    h.store.jobs["shipment-b-err"] = record(
        id="shipment-b-err", batch_id="b-err", state="failed", result=None, progress=None, error=error
    )

    body = h.get_job("shipment-b-err").json()

    assert body["error"] == {
        "code": "csv.bad_quantity",
        "message": "A quantity is a whole number from 1 to 1000000, digits only.",
        "issues": [{"line": 2, "column": 2, "code": "csv.bad_quantity", "message": "bad"}],
        "issuesTruncated": False,
    }


def test_other_owner_and_unknown_id_get_byte_identical_404s(h: Harness) -> None:
    assert h.post_json({"batchId": "b-13", "csv": VALID_CSV}).status == 202

    foreign = h.get_job("shipment-b-13", key=KEY_B)
    unknown = h.get_job("shipment-never-sent", key=KEY_B)

    assert_problem(foreign, 404, "job.not_found")
    assert_problem(unknown, 404, "job.not_found")
    assert foreign.body == unknown.body
    assert without_request_id(foreign.headers) == without_request_id(unknown.headers)
    assert b"shipment-b-13" not in foreign.body
    assert h.get_job("shipment-b-13").status == 200


# -- GET /api/shipments/{batchId} ---------------------------------------------------


def test_owner_reads_an_applied_shipment(h: Harness) -> None:
    h.store.shipments["b-done"] = shipment()

    result = h.call("GET", "/api/shipments/b-done")

    assert result.status == 200
    assert result.header("Content-Type") == "application/json"
    body = result.json()
    assert body.keys() == {"batchId", "location", "state", "appliedAt", "result", "contentSha256"}
    assert body["batchId"] == "b-done"
    assert body["state"] == "applied"
    assert datetime.fromisoformat(body["appliedAt"]) == iso(NOW_MS + 5000)
    assert body["result"] == {"imported": 3, "batchId": "b-done"}
    assert b"owner-a" not in result.body


def test_other_owner_and_unknown_batch_get_byte_identical_shipment_404s(h: Harness) -> None:
    h.store.shipments["b-done"] = shipment()

    foreign = h.call("GET", "/api/shipments/b-done", key=KEY_B)
    unknown = h.call("GET", "/api/shipments/b-never", key=KEY_B)

    assert_problem(foreign, 404, "shipment.not_found")
    assert_problem(unknown, 404, "shipment.not_found")
    assert foreign.body == unknown.body
    assert without_request_id(foreign.headers) == without_request_id(unknown.headers)


def test_shipment_history_needs_a_key(h: Harness) -> None:
    result = h.call("GET", "/api/shipments/b-done", key=None)

    assert_problem(result, 401, "auth.required")
    assert h.store.calls == []


# -- routing --------------------------------------------------------------------


@pytest.mark.parametrize(
    "method,path,allow",
    [
        ("DELETE", "/api/imports", "GET, HEAD, POST"),
        ("POST", "/api/imports/shipment-b-1/events", "GET, HEAD"),
        ("PUT", "/api/imports/shipment-b-1", "GET, HEAD"),
        ("POST", "/health", "GET, HEAD"),
    ],
)
def test_wrong_method_is_405_with_allow(h: Harness, method: str, path: str, allow: str) -> None:
    result = h.call(method, path)

    assert_problem(result, 405, "request.method_not_allowed")
    assert result.header("Allow") == allow
    assert h.store.calls == []


@pytest.mark.parametrize("path", ["/nope", "/index.html", "/api/imports/", "/api/imports/a/b", "/api", "/health/"])
def test_unknown_path_is_404(h: Harness, path: str) -> None:
    assert_problem(h.call("GET", path), 404, "request.not_found")


# -- store failures ---------------------------------------------------------------


def _post_and_get(h: Harness) -> list[Result]:
    return [h.post_json({"batchId": "b-14", "csv": VALID_CSV}), h.get_job("shipment-b-14")]


def test_unreachable_store_is_503_with_retry_after(h: Harness) -> None:
    h.store.failure = StoreDown("cannot connect to redis://10.0.0.1:6379")

    for result in _post_and_get(h):
        assert_problem(result, 503, "service.unavailable")
        retry_after = result.header("Retry-After")
        assert retry_after is not None and retry_after.isdigit() and int(retry_after) > 0
        assert b"10.0.0.1" not in result.body
    assert h.sender.sent == []


def test_unexpected_error_is_500_and_leaks_nothing(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    h.store.failure = RuntimeError("secret /etc/path redis://10.0.0.1")

    with caplog.at_level("ERROR", logger="importer.http"):
        results = _post_and_get(h)

    for result in results:
        assert_problem(result, 500, "internal")
        for leak in (b"secret", b"/etc", b"redis://", b"Traceback", b"RuntimeError", b"10.0.0.1"):
            assert leak not in result.body
    assert h.sender.sent == []
    assert any(r.exc_info is not None for r in caplog.records)  # the diagnosis goes to the log


def test_error_not_listed_as_unavailable_is_500_not_503() -> None:
    h = make_harness(unavailable=())
    h.store.failure = StoreDown("down")

    assert_problem(h.post_json({"batchId": "b-15", "csv": VALID_CSV}), 500, "internal")


# -- /health ------------------------------------------------------------------------


def test_health_ok(h: Harness) -> None:
    result = h.call("GET", "/health", key=None)

    assert result.status == 200
    assert result.header("Content-Type") == "application/json"
    assert result.json() == {
        "status": "ok",
        "workers": {"alive": 0, "acceptedVersions": [], "producerVersion": 1, "acceptsImports": True},
    }
    assert h.store.calls == ["ping", "live_workers"]


def test_health_reports_the_live_workers_and_the_door(h: Harness) -> None:
    h.api.producer_version = h.store.producer_version = 2
    h.store.workers = {"host:1:a": frozenset({1}), "host:2:b": frozenset({1, 3})}

    result = h.call("GET", "/health", key=None)

    # Still 200: this process is fine, its GETs serve; its POSTs answer 503 contract.no_worker.
    assert result.status == 200
    assert result.json()["workers"] == {"alive": 2, "acceptedVersions": [1, 3], "producerVersion": 2, "acceptsImports": False}
    assert "host" not in result.body.decode()  # no worker names or hosts on an open route


# -- the door check: 503 contract.no_worker ------------------------------------------


def test_no_live_worker_accepting_the_version_is_503_and_records_nothing(h: Harness) -> None:
    h.store.producer_version = 2
    h.store.workers = {"w1": frozenset({1})}

    result = h.post_json({"batchId": "b-door", "csv": VALID_CSV})

    body = assert_problem(result, 503, "contract.no_worker")
    assert result.header("Retry-After") == "5"
    assert body["producerVersion"] == 2 and body["acceptedVersions"] == [1]
    assert "version 2" in body["detail"] and "version 1" in body["detail"]
    assert h.store.jobs == {} and h.store.uploads == {} and h.sender.sent == []
    assert h.store.rate_tokens == ["owner-a"]  # taken before the body was read, as for any POST


@pytest.mark.parametrize("workers", [{}, {"w1": frozenset({1}), "w2": frozenset({1, 2})}])
def test_no_worker_alive_or_one_matching_is_accepted(h: Harness, workers: dict[str, frozenset[int]]) -> None:
    h.store.producer_version = 2
    h.store.workers = workers

    assert h.post_json({"batchId": "b-door-ok", "csv": VALID_CSV}).status == 202
    assert "shipment-b-door-ok" in h.store.jobs


def test_health_is_503_closing_once_shutdown_began(h: Harness) -> None:
    assert h.api.lifecycle.begin_closing() is True
    assert h.api.lifecycle.begin_closing() is False
    assert h.api.lifecycle.closing

    result = h.call("GET", "/health", key=None)

    assert result.status == 503
    assert result.json() == {"status": "unavailable", "reason": "closing"}


def test_health_is_503_when_redis_does_not_answer(h: Harness) -> None:
    h.store.failure = StoreDown("no route to redis://10.0.0.1")

    result = h.call("GET", "/health", key=None)

    assert result.status == 503
    assert result.header("Content-Type") == "application/json"
    assert result.json() == {"status": "unavailable", "reason": "redis_unreachable"}
