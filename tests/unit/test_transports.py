"""The serverless transport (handlers/serverless.py) against the WSGI transport.

Each recorded API Gateway HTTP API (payload format 2.0) event in
fixtures/events/ goes through the Lambda handler and, turned into the WSGI
environ a server would build from the same request, through the WSGI app,
each with its own freshly built Api on the typed fakes of
test_http_handlers.py. Both must give the same status, the same body bytes
and the same values of the headers a client acts on. No network, no Redis.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from importer.adapters.processes import aws_lambda as serverless_entry
from importer.handlers.api import Api, Lifecycle
from importer.handlers.auth import KeyRing, hash_key
from importer.handlers.http import Request, Response, json_response, problem
from importer.handlers.serverless import UnsupportedEvent, make_handler, to_event_response, to_request
from importer.handlers.wsgi import body_limit, create_app
from tests.unit.fakes import CountingUuids, FakeSender, FakeStore, StoreDown
from tests.unit.test_http_handlers import (
    Result,
    assert_problem,
    call_wsgi,
)

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "fixtures" / "events"
FIXTURE_KEY = "imp_fixture-key-owner-a"
MAX_UPLOAD_BYTES = 1024
CSV = "sku,quantity\nBOLT-M8-STEEL,120\nNUT-M8-ZINC,240\nWASHER-M8-FLAT,500\n"

#: The headers a client acts on; their values must not depend on the transport.
HEADERS_THAT_MATTER = ("Content-Type", "Location", "WWW-Authenticate", "Retry-After", "Allow")
RESPONSE_KEYS = {"statusCode", "headers", "body", "isBase64Encoded"}

#: Recorded event -> the status it must get (with the setup of SETUP run first).
EXPECTED_STATUS = {
    "enqueue-json.json": 202,
    "enqueue-csv-base64.json": 202,
    "status.json": 200,
    "health.json": 200,
    "not-found.json": 404,
    "unauthorized.json": 401,
}
#: Events sent first, through the same transport, so the recorded one finds its job.
SETUP = {"status.json": ("enqueue-json.json",)}


def load_event(name: str) -> dict[str, Any]:
    event = json.loads((EVENTS / name).read_text(encoding="utf-8"))
    assert isinstance(event, dict)
    return event


# -- two transports on identical fakes ---------------------------------------------


@dataclass
class Side:
    """One freshly built Api on fakes, with its key ring."""

    api: Api
    store: FakeStore
    sender: FakeSender
    keys: KeyRing


def build_side() -> Side:
    store, sender = FakeStore(), FakeSender()
    api = Api(
        store=store,
        sender=sender,
        max_upload_bytes=MAX_UPLOAD_BYTES,
        max_rows=1000,
        openapi_yaml=lambda: "openapi: 3.0.3\ninfo: {title: Importer}\n",
        uuidgen=CountingUuids(),
        unavailable_errors=(StoreDown,),
        lifecycle=Lifecycle(),
    )
    return Side(api, store, sender, KeyRing.parse(f"owner-a:{hash_key(FIXTURE_KEY)}"))


def event_body(event: dict[str, Any]) -> bytes:
    body = event.get("body") or ""
    return base64.b64decode(body) if event.get("isBase64Encoded") else body.encode()


def run_lambda(side: Side, event: dict[str, Any]) -> tuple[Result, dict[str, Any]]:
    out = make_handler(side.api, side.keys)(copy.deepcopy(event), None)
    assert set(out) == RESPONSE_KEYS  # no "cookies", nothing else
    assert isinstance(out["body"], str)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in out["headers"].items())
    body = base64.b64decode(out["body"]) if out["isBase64Encoded"] else out["body"].encode()
    return Result(out["statusCode"], tuple(out["headers"].items()), body), out


def run_wsgi(side: Side, event: dict[str, Any]) -> Result:
    """The same request as a WSGI server would present it (PEP 3333), through the validator."""
    headers = dict(event.get("headers") or {})
    content_type = headers.pop("content-type", None)
    headers.pop("content-length", None)  # CONTENT_LENGTH comes from the body
    return call_wsgi(
        create_app(side.api, side.keys),
        event["requestContext"]["http"]["method"],
        unquote(event["rawPath"]),
        query=event.get("rawQueryString", ""),
        body=event_body(event),
        content_type=content_type,
        headers=list(headers.items()),
    )


def assert_same_answer(lam: Result, wsgi: Result) -> None:
    assert lam.status == wsgi.status, (lam.body, wsgi.body)
    assert lam.body == wsgi.body
    for name in HEADERS_THAT_MATTER:
        assert lam.header(name) == wsgi.header(name), name


def assert_same_effects(lam: Side, wsgi: Side) -> None:
    assert lam.store.calls == wsgi.store.calls
    assert lam.store.jobs == wsgi.store.jobs
    assert lam.store.uploads == wsgi.store.uploads
    assert lam.sender.sent == wsgi.sender.sent


def compare(event: dict[str, Any], setup: tuple[dict[str, Any], ...] = (), prepare: Callable[[Side], None] | None = None) -> tuple[Result, dict[str, Any], Side]:
    lam, wsgi = build_side(), build_side()
    for earlier in setup:
        assert_same_answer(run_lambda(lam, earlier)[0], run_wsgi(wsgi, earlier))
    if prepare is not None:
        prepare(lam)
        prepare(wsgi)
    lam_result, out = run_lambda(lam, event)
    assert_same_answer(lam_result, run_wsgi(wsgi, event))
    assert_same_effects(lam, wsgi)
    return lam_result, out, lam


# -- the recorded events -------------------------------------------------------------


def test_every_recorded_event_is_covered() -> None:
    assert sorted(p.name for p in EVENTS.glob("*.json")) == sorted(EXPECTED_STATUS)
    for name in EXPECTED_STATUS:
        event = load_event(name)
        assert event["version"] == "2.0" and event["routeKey"] == "$default"
        assert event["requestContext"]["http"]["path"] == event["rawPath"]
        if "body" in event:
            assert int(event["headers"]["content-length"]) == len(event_body(event))


@pytest.mark.parametrize("name", sorted(EXPECTED_STATUS))
def test_recorded_event_gets_the_same_answer_as_wsgi(name: str) -> None:
    setup = tuple(load_event(n) for n in SETUP.get(name, ()))

    result, out, side = compare(load_event(name), setup)

    assert result.status == EXPECTED_STATUS[name]
    assert out["isBase64Encoded"] is False  # every answer here is JSON or problem+json
    assert result.header("Content-Type") in ("application/json", "application/problem+json")


def test_recorded_enqueues_store_the_csv_and_send_one_message_each() -> None:
    side = build_side()
    handle = make_handler(side.api, side.keys)

    json_out = handle(load_event("enqueue-json.json"), None)
    csv_out = handle(load_event("enqueue-csv-base64.json"), None)

    assert json.loads(json_out["body"]) == {"jobId": "shipment-fixture-2026-001", "batchId": "fixture-2026-001", "location": "main", "state": "waiting"}
    assert json.loads(csv_out["body"]) == {"jobId": "shipment-fixture-2026-002", "batchId": "fixture-2026-002", "location": "main", "state": "waiting"}
    assert csv_out["headers"]["Location"] == "/api/imports/shipment-fixture-2026-002"
    assert list(side.store.uploads.values()) == [CSV.encode(), CSV.encode()]
    assert [m.job_id for m in side.sender.sent] == ["shipment-fixture-2026-001", "shipment-fixture-2026-002"]
    assert all(record.owner == "owner-a" for record in side.store.jobs.values())


def test_recorded_status_shows_the_enqueued_job() -> None:
    result, _, _ = compare(load_event("status.json"), (load_event("enqueue-json.json"),))

    assert result.json()["id"] == "shipment-fixture-2026-001"
    assert result.json()["state"] == "waiting"


def test_recorded_unauthorized_is_401_with_www_authenticate_and_touches_nothing() -> None:
    result, _, side = compare(load_event("unauthorized.json"))

    assert_problem(result, 401, "auth.required")
    assert result.header("WWW-Authenticate") == 'Bearer realm="importer"'
    assert side.store.calls == []


def test_recorded_not_found_is_the_job_404() -> None:
    result, _, _ = compare(load_event("not-found.json"))

    assert_problem(result, 404, "job.not_found")


# -- derived events: the other headers that matter -------------------------------------


def _is_base64(event: dict[str, Any]) -> bool:
    try:
        event_body(event)
    except ValueError:
        return False
    return True


def _with(name: str, **changes: Any) -> dict[str, Any]:
    event = load_event(name)
    method = changes.pop("method", None)
    if method is not None:
        event["requestContext"]["http"]["method"] = method
    path = changes.pop("path", None)
    if path is not None:
        event["rawPath"] = event["requestContext"]["http"]["path"] = path
    event.update(changes)
    if "body" in changes and "content-length" in event.get("headers", {}) and _is_base64(event):
        # As API Gateway would deliver it: the header counts the new body's bytes.
        event["headers"]["content-length"] = str(len(event_body(event)))
    return event


def test_wrong_method_gets_the_same_405_and_allow() -> None:
    result, _, _ = compare(_with("health.json", method="DELETE"))

    assert_problem(result, 405, "request.method_not_allowed")
    assert result.header("Allow") == "GET, HEAD"


def test_store_down_gets_the_same_503_and_retry_after() -> None:
    def down(side: Side) -> None:
        side.store.failure = StoreDown("cannot connect to redis://10.0.0.1:6379")

    result, _, _ = compare(load_event("enqueue-json.json"), prepare=down)

    assert_problem(result, 503, "service.unavailable")
    assert result.header("Retry-After") == "5"


def test_conflicting_enqueue_gets_the_same_409() -> None:
    other = load_event("enqueue-csv-base64.json")
    other["rawQueryString"] = "batchId=fixture-2026-001"
    other["body"] = base64.b64encode(b"sku,quantity\nBOLT-M8-STEEL,121\n").decode()
    other["headers"]["content-length"] = str(len(event_body(other)))

    result, _, _ = compare(other, (load_event("enqueue-json.json"),))

    assert_problem(result, 409, "batch.conflict")


def test_openapi_document_is_sent_as_text() -> None:
    result, out, _ = compare(_with("health.json", path="/openapi.yaml"))

    assert result.status == 200
    assert result.header("Content-Type") == "application/yaml"
    assert out["isBase64Encoded"] is False


def test_unknown_path_gets_the_same_404() -> None:
    result, _, _ = compare(_with("health.json", path="/api/nope"))

    assert_problem(result, 404, "request.not_found")


# -- body limit -----------------------------------------------------------------------


@pytest.mark.parametrize("encoded", [False, True], ids=["text", "base64"])
@pytest.mark.parametrize("key", [True, False], ids=["with-key", "without-key"])
def test_oversized_body_is_the_same_413_as_wsgi(encoded: bool, key: bool) -> None:
    raw = b"x" * (body_limit(build_side().api) + 1)
    event = load_event("enqueue-csv-base64.json")
    event["body"] = base64.b64encode(raw).decode() if encoded else raw.decode()
    event["isBase64Encoded"] = encoded
    event["headers"]["content-length"] = str(len(raw))
    if not key:
        del event["headers"]["authorization"]

    result, out, side = compare(event)

    problem_body = assert_problem(result, 413, "request.too_large")
    assert "instance" not in problem_body  # the transport's 413, not the handler's
    assert out["isBase64Encoded"] is False
    assert side.store.calls == []


@pytest.mark.parametrize("limit", [10, 11, 12, 6144])
@pytest.mark.parametrize("encoded", [False, True], ids=["text", "base64"])
def test_body_limit_boundary(limit: int, encoded: bool) -> None:
    def event(size: int) -> dict[str, Any]:
        raw = b"y" * size
        body = base64.b64encode(raw).decode() if encoded else raw.decode()
        return _with("enqueue-csv-base64.json", body=body, isBase64Encoded=encoded)

    at_limit = to_request(event(limit), limit=limit)
    over = to_request(event(limit + 1), limit=limit)

    assert isinstance(at_limit, Request) and at_limit.body == b"y" * limit
    assert isinstance(over, Response) and over == problem("request.too_large")


def test_text_body_limit_counts_utf8_bytes() -> None:
    event = _with("enqueue-json.json", body="é" * 6)  # 6 characters, 12 bytes

    assert isinstance(to_request(event, limit=12), Request)
    assert isinstance(to_request(event, limit=11), Response)


# -- request mapping --------------------------------------------------------------------


def test_to_request_maps_the_recorded_csv_event() -> None:
    request = to_request(load_event("enqueue-csv-base64.json"))

    assert isinstance(request, Request)
    assert request.method == "POST"
    assert request.path == "/api/imports"
    assert request.query == {"batchId": "fixture-2026-002"}
    assert request.headers["authorization"] == f"Bearer {FIXTURE_KEY}"
    assert request.headers["content-type"] == "text/csv"
    assert all(name == name.lower() for name in request.headers)
    assert request.body == CSV.encode()
    assert request.owner is None and request.path_params == {}


def test_headers_are_lower_cased_and_repeats_joined() -> None:
    event = _with("health.json", headers={"X-Trace": "a", "x-trace": "b", "Accept": ["text/csv", "application/json"]})

    request = to_request(event)

    assert isinstance(request, Request)
    assert request.headers == {"x-trace": "a,b", "accept": "text/csv,application/json"}


def test_query_keeps_blank_values_and_decodes() -> None:
    event = _with("health.json", rawQueryString="batchId=&note=a%20b&flag")

    request = to_request(event)

    assert isinstance(request, Request)
    assert request.query == {"batchId": "", "note": "a b", "flag": ""}


def test_query_falls_back_to_query_string_parameters() -> None:
    event = load_event("enqueue-csv-base64.json")
    del event["rawQueryString"]

    request = to_request(event)

    assert isinstance(request, Request)
    assert request.query == {"batchId": "fixture-2026-002"}


def test_percent_encoded_path_of_a_function_url_is_decoded_like_path_info() -> None:
    event = _with("status.json", rawPath="/api/imports/shipment-fixture%2D2026%2D001")

    request = to_request(event)

    assert isinstance(request, Request)
    assert request.path == "/api/imports/shipment-fixture-2026-001"


def test_event_without_body_has_an_empty_body() -> None:
    request = to_request(load_event("health.json"))

    assert isinstance(request, Request) and request.body == b""


@pytest.mark.parametrize(
    "event",
    [
        {"version": "1.0", "httpMethod": "GET", "path": "/health", "headers": {}},
        {"version": "2.0", "rawPath": "/health"},
        {"version": "2.0", "rawPath": "/health", "requestContext": {"http": None}},
    ],
    ids=["payload-1.0", "no-request-context", "null-http"],
)
def test_event_of_another_shape_is_refused_loudly(event: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedEvent, match="payload format 2.0"):
        to_request(event)


def test_body_flagged_base64_that_is_not_base64_is_refused_loudly() -> None:
    with pytest.raises(UnsupportedEvent, match="base64"):
        to_request(_with("enqueue-csv-base64.json", body="not base64!"))


# -- response mapping and base64 -------------------------------------------------------------


def test_base64_round_trip_of_a_text_csv_body() -> None:
    raw = "\ufeffsku,quantity\r\nBOLT-M8-STEEL,120\r\nNUT-M8-ZINC,240\r\n".encode()
    event = _with("enqueue-csv-base64.json", body=base64.b64encode(raw).decode(), isBase64Encoded=True)
    side = build_side()

    out = make_handler(side.api, side.keys)(event, None)

    assert out["statusCode"] == 202
    assert out["isBase64Encoded"] is False
    assert list(side.store.uploads.values()) == [raw]
    back = to_event_response(Response(200, raw, (("Content-Type", "text/csv; charset=utf-8"),)))
    assert back["isBase64Encoded"] is False and back["body"].encode() == raw


@pytest.mark.parametrize(
    "content_type,body",
    [
        ("application/octet-stream", bytes(range(256))),
        ("text/csv", b"sku,quantity\nBAD-\xff\xfe,1\n"),  # not UTF-8: cannot be sent as text
        ("", b"\x00\x01"),
    ],
    ids=["binary", "text-not-utf8", "no-content-type"],
)
def test_other_bodies_are_sent_base64(content_type: str, body: bytes) -> None:
    headers = (("Content-Type", content_type),) if content_type else ()

    out = to_event_response(Response(200, body, headers))

    assert out["isBase64Encoded"] is True
    assert base64.b64decode(out["body"]) == body


@pytest.mark.parametrize(
    "response",
    [
        json_response(202, {"jobId": "shipment-é"}),
        problem("job.not_found"),
        Response(200, b"a: 1\n", (("Content-Type", "application/yaml"),)),
        Response(200, b"# HELP x\n", (("Content-Type", "text/plain; version=0.0.4; charset=utf-8"),)),
        Response(200, b"{}", (("Content-Type", "application/vnd.example+json"),)),
    ],
    ids=["json", "problem", "yaml", "prometheus-text", "vendor-json"],
)
def test_text_responses_are_not_base64(response: Response) -> None:
    out = to_event_response(response)

    assert out["isBase64Encoded"] is False
    assert out["body"].encode() == response.body
    assert out["statusCode"] == response.status
    assert set(out) == RESPONSE_KEYS


def test_repeated_response_header_names_are_joined() -> None:
    response = Response(200, b"{}", (("Content-Type", "application/json"), ("Vary", "Accept"), ("vary", "Authorization")))

    out = to_event_response(response)

    assert out["headers"] == {"Content-Type": "application/json", "Vary": "Accept,Authorization"}


def test_empty_body_is_an_empty_text() -> None:
    out = to_event_response(Response(204))

    assert out == {"statusCode": 204, "headers": {}, "body": "", "isBase64Encoded": False}


# -- the deployment entry point -------------------------------------------------------------


def test_importing_the_lambda_entry_builds_and_connects_nothing() -> None:
    code = (
        "import sys\n"
        "import importer.adapters.processes.aws_lambda as s\n"
        "assert callable(s.handler) and s._deployed is None\n"
        "outside = sorted(m for m in sys.modules if m in ('importer.adapters.bootstrap', 'importer.adapters.redis.store') or m.split('.')[0] in "
        "('importer.adapters.bootstrap', 'redis', 'dramatiq', 'gunicorn', 'boto3', 'botocore', 'awslambdaric'))\n"
        "assert not outside, outside\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMPORTER_")}

    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30
    )

    assert done.returncode == 0, done.stderr


@pytest.fixture
def fresh_module_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    """No cached deployment, no IMPORTER_* variable, no logging reconfiguration."""
    import importer.adapters.logs

    for name in list(os.environ):
        if name.startswith("IMPORTER_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(serverless_entry, "_deployed", None)
    monkeypatch.setattr(importer.adapters.logs, "configure_logging", lambda level="INFO": None)


@dataclass
class FakeHttpSide:
    """What importer.adapters.processes.aws_lambda uses of importer.adapters.bootstrap.HttpSide."""

    api: Api


@pytest.mark.usefixtures("fresh_module_handler")
def test_module_handler_builds_once_from_the_environment_and_reuses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importer.adapters.bootstrap
    from importer.adapters.settings import Settings

    built: list[Settings] = []
    side = build_side()

    def fake_build_http(settings: Settings) -> FakeHttpSide:
        built.append(settings)
        return FakeHttpSide(side.api)

    monkeypatch.setattr(importer.adapters.bootstrap, "build_http", fake_build_http)
    monkeypatch.setenv("IMPORTER_REDIS_URL", "redis://redis.invalid:6379/0")
    monkeypatch.setenv("IMPORTER_API_KEYS", f"owner-a:{hash_key(FIXTURE_KEY)}")
    assert built == []  # nothing built before the first invocation

    answers = [serverless_entry.handler(load_event(name), None)["statusCode"] for name in ("health.json", "enqueue-json.json", "status.json", "unauthorized.json")]

    assert answers == [200, 202, 200, 401]
    assert len(built) == 1
    assert built[0].redis_url == "redis://redis.invalid:6379/0"
    assert side.store.jobs["shipment-fixture-2026-001"].owner == "owner-a"  # KeyRing from IMPORTER_API_KEYS


@pytest.mark.usefixtures("fresh_module_handler")
def test_module_handler_without_redis_url_fails_without_connecting_and_retries_later() -> None:
    from importer.adapters.settings import SettingsError

    with pytest.raises(SettingsError, match="IMPORTER_REDIS_URL"):
        serverless_entry.handler(load_event("health.json"), None)

    assert serverless_entry._deployed is None


@pytest.mark.usefixtures("fresh_module_handler")
def test_module_handler_with_the_real_composition_root_and_no_redis_answers_503(monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing listens on port 1: building must not connect, /health reports it.
    monkeypatch.setenv("IMPORTER_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("IMPORTER_API_KEYS", f"owner-a:{hash_key(FIXTURE_KEY)}")
    try:
        health = serverless_entry.handler(load_event("health.json"), None)
        unauthorized = serverless_entry.handler(load_event("unauthorized.json"), None)
    finally:
        deployed = serverless_entry._deployed
        if deployed is not None:
            deployed.side.close()

    assert (health["statusCode"], json.loads(health["body"])) == (503, {"status": "unavailable", "reason": "redis_unreachable"})
    assert unauthorized["statusCode"] == 401
    assert deployed is not None and type(deployed.side).__name__ == "HttpSide"
