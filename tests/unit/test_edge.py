"""The HTTP edge (handlers/edge.py) through both transports, in process, on the
typed fakes: whole bodies only, key and rate limit before the body, upload
slots, HEAD, common headers, request ids, and no 5xx from anything a client
can send (hypothesis over bodies and headers)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from importer.adapters.logs import JsonFormatter
from importer.handlers.api import RATE_TOKEN_WITH_ENQUEUE_BYTES
from importer.handlers.digest import content_digest
from importer.handlers.edge import LARGE_UPLOAD_BYTES
from importer.handlers.serverless import make_handler
from importer.handlers.wsgi import body_limit, create_app
from tests.unit.test_http_handlers import (
    KEY_A,
    VALID_CSV,
    ExplodingStream,
    Harness,
    Result,
    assert_problem,
    call_wsgi,
    make_harness,
)

COMMON = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


@pytest.fixture
def h() -> Harness:
    return make_harness()


class ShortStream:
    """A wsgi.input that ends early, as gunicorn's does when the client closed
    (or half-closed) before the whole Content-Length arrived."""

    def __init__(self, data: bytes) -> None:
        self._io = io.BytesIO(data)

    def read(self, size: int = -1) -> bytes:
        return self._io.read(size)


class CutChunkedStream:
    """A wsgi.input that raises mid-body, as gunicorn's does on a cut chunked body (NoMoreData)."""

    def __init__(self, first: bytes) -> None:
        self.first: bytes | None = first

    def read(self, size: int = -1) -> bytes:
        if self.first is not None:
            data, self.first = self.first, None
            return data
        raise OSError("No more data after: None")  # any error from the server's stream


# -- complete bodies only -----------------------------------------------------------


@pytest.mark.parametrize("cut", [0, 1, 10, len(VALID_CSV) - 1])
def test_a_body_shorter_than_its_content_length_is_refused_and_nothing_recorded(h: Harness, cut: int) -> None:
    data = VALID_CSV.encode()
    result = h.call(
        "POST", "/api/imports", query="batchId=b-cut", stream=ShortStream(data[:cut]),
        content_length=str(len(data)), content_type="text/csv", validate=False,
    )

    problem = assert_problem(result, 400, "request.incomplete")
    assert problem["instance"] == "/api/imports"
    assert h.store.calls == [] and h.store.jobs == {} and h.sender.sent == []


GUNICORN = {"SERVER_SOFTWARE": "gunicorn/27.0.1"}


def test_a_chunked_body_cut_by_the_server_error_is_refused(h: Harness) -> None:
    result = h.call(
        "POST", "/api/imports", query="batchId=b-cut", stream=CutChunkedStream(VALID_CSV.encode()[:20]),
        content_type="text/csv", headers=[("Transfer-Encoding", "chunked")], validate=False, extra_environ=GUNICORN,
    )

    assert_problem(result, 400, "request.incomplete")
    assert h.store.jobs == {} and h.sender.sent == []


@pytest.mark.parametrize("software", ["Granian", "", "uWSGI"])
@pytest.mark.parametrize("framing", [{"HTTP_TRANSFER_ENCODING": "chunked"}, {"SERVER_PROTOCOL": "HTTP/2"}])
def test_a_body_without_length_on_a_server_that_cannot_report_a_cut_is_refused_unread(
    h: Harness, software: str, framing: dict[str, str]
) -> None:
    """granian hands a chunked body cut at any point over as if it had ended;
    so may any server not known to report cuts: without a Content-Digest such
    a body is refused before a byte of it is read."""
    result = h.call(
        "POST", "/api/imports", query="batchId=b-cut", stream=ExplodingStream(), content_type="text/csv",
        validate=False, extra_environ={"SERVER_SOFTWARE": software, **framing},
    )
    problem = assert_problem(result, 411, "request.length_required")
    assert "Content-Length" in problem["detail"]
    assert h.store.calls == [] and h.store.jobs == {}


def test_a_body_without_length_is_taken_on_granian_when_its_digest_proves_it(h: Harness) -> None:
    data = VALID_CSV.encode()
    granian = {"SERVER_SOFTWARE": "Granian", "HTTP_TRANSFER_ENCODING": "chunked"}
    cut = h.call(
        "POST", "/api/imports", query="batchId=b-dig", stream=io.BytesIO(data[:-7]), content_type="text/csv",
        headers=[("Content-Digest", content_digest(data))], validate=False, extra_environ=granian,
    )
    assert_problem(cut, 400, "request.digest_mismatch")
    assert h.store.jobs == {}
    whole = h.call(
        "POST", "/api/imports", query="batchId=b-dig", stream=io.BytesIO(data), content_type="text/csv",
        headers=[("Content-Digest", content_digest(data))], validate=False, extra_environ=granian,
    )
    assert whole.status == 202 and "shipment-b-dig" in h.store.jobs


def test_an_empty_chunked_body_on_gunicorn_is_refused_for_what_it_is(h: Harness) -> None:
    """gunicorn reports a cut chunked body, so an empty one is really empty:
    it is taken as the upload it is (its job fails with csv.empty), not refused as incomplete."""
    result = h.call(
        "POST", "/api/imports", query="batchId=b-empty", stream=io.BytesIO(b""), content_type="text/csv",
        headers=[("Transfer-Encoding", "chunked")], validate=False, extra_environ=GUNICORN,
    )
    assert result.status == 202 and "shipment-b-empty" in h.store.jobs


@pytest.mark.parametrize(("header", "code"), [
    ("sha-256=:AAAA:", "request.bad_digest"),  # 3 bytes, not a SHA-256
    ("md5=:rL0Y20zC+Fzt72VPzMSk2A==:", "request.bad_digest"),  # no algorithm checked here
    ("sha-256=abc", "request.bad_digest"),  # not a byte sequence
    ("sha-256=:!!!!:", "request.bad_digest"),
    ("sha-512=:" + "A" * 86 + "==:", "request.digest_mismatch"),
])
def test_a_content_digest_that_is_invalid_or_does_not_match_is_refused(h: Harness, header: str, code: str) -> None:
    data = VALID_CSV.encode()
    result = h.call(
        "POST", "/api/imports", query="batchId=b-dig", body=data, content_type="text/csv",
        headers=[("Content-Digest", header)], validate=False,
    )
    assert_problem(result, 400, code)
    assert h.store.jobs == {}


def test_a_matching_content_digest_with_several_members_and_parameters_is_taken(h: Harness) -> None:
    data = VALID_CSV.encode()
    sha512 = "sha-512=:" + base64.b64encode(hashlib.sha512(data).digest()).decode() + ":"
    header = f"md5=:abc=:, {content_digest(data)};note=1, {sha512}"
    result = h.call(
        "POST", "/api/imports", query="batchId=b-dig", body=data, content_type="text/csv",
        headers=[("Content-Digest", header)], validate=False,
    )
    assert result.status == 202


def test_a_serverless_body_that_differs_from_its_content_length_is_refused() -> None:
    h = make_harness()
    handler = make_handler(h.api, _keys(h))
    body = VALID_CSV
    event = _event("POST", "/api/imports", body=body, query="batchId=b-1",
                   headers={"content-type": "text/csv", "content-length": str(len(body) + 5),
                            "authorization": f"Bearer {KEY_A}"})

    out = handler(event, None)

    assert out["statusCode"] == 400 and json.loads(out["body"])["code"] == "request.incomplete"
    assert h.store.jobs == {}
    event["headers"]["content-length"] = str(len(body))
    assert handler(event, None)["statusCode"] == 202


@pytest.mark.parametrize("length", ["\u00b2", "\u0661\u0660", "\uff15", "1" * 5000, "-1", "0x10", ""])
@pytest.mark.parametrize("method", ["POST", "GET"])
def test_a_serverless_content_length_that_is_no_number_is_400_and_nothing_recorded(method: str, length: str) -> None:
    """\u00b2 passed str.isdigit() and then made int() raise: the handler raised, API Gateway answered 502."""
    h = make_harness()
    event = _event(method, "/api/imports", body=VALID_CSV if method == "POST" else "", query="batchId=b-len",
                   headers={"content-type": "text/csv", "content-length": length, "authorization": f"Bearer {KEY_A}"})

    out = make_handler(h.api, _keys(h))(event, None)

    assert out["statusCode"] == 400 and json.loads(out["body"])["code"] == "request.bad_length", out
    assert h.store.jobs == {}


# -- authenticate, then rate-limit, then read --------------------------------------------


@pytest.mark.parametrize(("authorization", "code"), [
    (None, "auth.required"), ("Bearer imp_wrong", "auth.invalid"), ("Basic abc", "auth.required")])
def test_a_wrong_key_reads_no_body(h: Harness, authorization: str | None, code: str) -> None:
    headers = [("Authorization", authorization)] if authorization else []
    result = h.call(
        "POST", "/api/imports", key=None, headers=headers, query="batchId=b-1", stream=ExplodingStream(),
        content_length=str(body_limit(h.api)), content_type="text/csv",
    )

    assert_problem(result, 401, code)
    assert h.store.rate_tokens == []  # refused before the rate limit too


def test_a_rate_limited_large_post_reads_no_body_and_says_when_to_come_back() -> None:
    h = make_harness(max_upload_bytes=1024 * 1024)
    h.store.rate_wait_ms = 1200

    result = h.call(
        "POST", "/api/imports", query="batchId=b-1", stream=ExplodingStream(),
        content_length=str(RATE_TOKEN_WITH_ENQUEUE_BYTES + 1), content_type="text/csv",
    )

    assert_problem(result, 429, "request.rate_limited")
    assert result.header("Retry-After") == "2"
    assert h.store.rate_tokens == ["owner-a"] and h.store.calls == []


def test_a_small_post_takes_its_rate_token_in_the_enqueue_step_and_records_nothing_past_it(h: Harness) -> None:
    """One round trip per POST: a small declared body is read (it came with
    the headers) and the enqueue step takes the token first, refusing there."""
    h.store.rate_wait_ms = 1200

    result = h.post_csv(VALID_CSV, "b-1")

    assert_problem(result, 429, "request.rate_limited")
    assert result.header("Retry-After") == "2"
    assert h.store.rate_tokens == ["owner-a"] and h.store.calls == ["enqueue"]
    assert h.store.jobs == {} and h.store.uploads == {} and h.sender.sent == []


def test_the_rate_token_is_taken_once_per_post_for_its_owner(h: Harness) -> None:
    assert h.post_csv(VALID_CSV, "b-1").status == 202
    assert h.post_csv(VALID_CSV, "b-2", key=None, headers=[("Authorization", "Bearer imp_test-key-for-owner-b")]).status == 202
    h.get_job("shipment-b-1")
    assert h.store.rate_tokens == ["owner-a", "owner-b"]  # GETs take none


@pytest.mark.parametrize("method,path", [("GET", "/api/imports/shipment-b-1"), ("GET", "/health"), ("DELETE", "/api/imports"), ("GET", "/nope")])
def test_routes_without_a_body_never_read_one(h: Harness, method: str, path: str) -> None:
    result = h.call(method, path, stream=ExplodingStream(), content_length="10")
    assert result.status < 500


# -- upload slots --------------------------------------------------------------------


class GatedStream:
    """A large body whose reading waits until the test opens the gate."""

    def __init__(self, data: bytes, gate: threading.Event, reading: threading.Event) -> None:
        self._io = io.BytesIO(data)
        self.gate, self.reading = gate, reading

    def read(self, size: int = -1) -> bytes:
        self.reading.set()
        assert self.gate.wait(10)
        return self._io.read(size)


def test_one_large_upload_too_many_gets_503_at_once_and_small_ones_go_on() -> None:
    h = make_harness()
    h.api.max_upload_bytes = 4 * LARGE_UPLOAD_BYTES
    h.api.max_concurrent_uploads = 1
    app = create_app(h.api, _keys(h))
    big = b"sku,quantity\n" + b"\n" * (2 * LARGE_UPLOAD_BYTES) + b"BIG-1,1\n"
    gate, reading = threading.Event(), threading.Event()
    first: list[Result] = []

    def post_first() -> None:
        first.append(call_wsgi(app, "POST", "/api/imports", query="batchId=big-1", content_type="text/csv",
                               headers=[("Authorization", f"Bearer {KEY_A}")], stream=GatedStream(big, gate, reading),
                               content_length=str(len(big)), validate=False))

    thread = threading.Thread(target=post_first)
    thread.start()
    try:
        assert reading.wait(10)
        second = call_wsgi(app, "POST", "/api/imports", query="batchId=big-2", content_type="text/csv",
                           headers=[("Authorization", f"Bearer {KEY_A}")], stream=ExplodingStream(),
                           content_length=str(len(big)), validate=False)
        assert_problem(second, 503, "service.busy")
        assert second.header("Retry-After") == "1"
        small = call_wsgi(app, "POST", "/api/imports", query="batchId=small-1", content_type="text/csv",
                          headers=[("Authorization", f"Bearer {KEY_A}")], body=VALID_CSV.encode())
        assert small.status == 202
    finally:
        gate.set()
        thread.join(10)
    assert first[0].status == 202
    # The slot is given back: the next large upload is taken.
    again = call_wsgi(app, "POST", "/api/imports", query="batchId=big-3", content_type="text/csv",
                      headers=[("Authorization", f"Bearer {KEY_A}")], body=big)
    assert again.status == 202


class TricklingStream:
    """A body that arrives a few bytes per read, each read taking a while."""

    def __init__(self, data: bytes, pause: float) -> None:
        self._io = io.BytesIO(data)
        self.pause = pause

    def read(self, size: int = -1) -> bytes:
        time.sleep(self.pause)
        return self._io.read(min(size, 8))


def test_a_body_still_arriving_at_its_deadline_gets_408_and_nothing_is_recorded() -> None:
    h = make_harness()
    h.api.body_timeout_s = 0.3
    app = create_app(h.api, _keys(h))
    body = VALID_CSV.encode()
    slow = call_wsgi(app, "POST", "/api/imports", query="batchId=slow-1", content_type="text/csv",
                     headers=[("Authorization", f"Bearer {KEY_A}")], stream=TricklingStream(body, 0.1),
                     content_length=str(len(body)), validate=False)
    assert_problem(slow, 408, "request.timeout")
    assert h.call("GET", "/api/imports/shipment-slow-1").status == 404


def test_bodies_read_at_once_are_bounded_and_the_slot_comes_back() -> None:
    """While IMPORTER_MAX_BODY_READS bodies are being read, one more POST gets
    503 service.busy (GETs go on); once the read ends the slot is free."""
    h = make_harness()
    h.api.max_body_reads = 1
    app = create_app(h.api, _keys(h))
    body = VALID_CSV.encode()
    gate, reading = threading.Event(), threading.Event()
    first: list[Result] = []

    def post_first() -> None:
        first.append(call_wsgi(app, "POST", "/api/imports", query="batchId=held-1", content_type="text/csv",
                               headers=[("Authorization", f"Bearer {KEY_A}")], stream=GatedStream(body, gate, reading),
                               content_length=str(len(body)), validate=False))

    thread = threading.Thread(target=post_first)
    thread.start()
    try:
        assert reading.wait(10)
        busy = call_wsgi(app, "POST", "/api/imports", query="batchId=next-1", content_type="text/csv",
                         headers=[("Authorization", f"Bearer {KEY_A}")], body=body)
        assert_problem(busy, 503, "service.busy")
        assert busy.header("Retry-After") == "1"
        assert h.call("GET", "/api/imports/shipment-nope").status == 404
    finally:
        gate.set()
        thread.join(10)
    assert first[0].status == 202
    again = call_wsgi(app, "POST", "/api/imports", query="batchId=next-1", content_type="text/csv",
                      headers=[("Authorization", f"Bearer {KEY_A}")], body=body)
    assert again.status == 202


class TimeoutSocket:
    """gunicorn.socket: records its timeouts and shutdowns."""

    def __init__(self) -> None:
        self.timeouts: list[float | None] = []
        self.shut: list[int] = []

    def gettimeout(self) -> float | None:
        return None

    def settimeout(self, value: float | None) -> None:
        self.timeouts.append(value)

    def shutdown(self, how: int) -> None:
        self.shut.append(how)


class TimingOutStream:
    """gunicorn's wsgi.input when its socket's timeout passes mid-body."""

    def __init__(self, first: bytes) -> None:
        self.first: bytes | None = first

    def read(self, size: int = -1) -> bytes:
        if self.first is not None:
            data, self.first = self.first, None
            return data
        raise TimeoutError("timed out")


def test_under_gunicorn_the_socket_times_out_and_its_read_side_is_shut() -> None:
    import socket

    h = make_harness()
    app = create_app(h.api, _keys(h))
    sock = TimeoutSocket()
    body = VALID_CSV.encode()
    result = call_wsgi(app, "POST", "/api/imports", query="batchId=slow-g", content_type="text/csv",
                       headers=[("Authorization", f"Bearer {KEY_A}")], stream=TimingOutStream(body[:5]),
                       content_length=str(len(body)), validate=False, extra_environ={"gunicorn.socket": sock})
    assert_problem(result, 408, "request.timeout")
    assert sock.shut == [socket.SHUT_RD]
    assert sock.timeouts[0] is not None and 0 < sock.timeouts[0] <= h.api.body_timeout_s
    assert sock.timeouts[-1] is None  # restored
    assert h.call("GET", "/api/imports/shipment-slow-g").status == 404


# -- HEAD, common headers, request ids -------------------------------------------------


@pytest.mark.parametrize("path", ["/health", "/openapi.yaml", "/api/imports/shipment-nope"])
def test_head_answers_like_get_without_a_body(h: Harness, path: str) -> None:
    get = h.call("GET", path)
    head = h.call("HEAD", path)

    assert head.status == get.status and head.body == b""
    assert head.header("Content-Length") == str(len(get.body))
    assert head.header("Content-Type") == get.header("Content-Type")


def test_a_head_refusal_has_no_body(h: Harness) -> None:
    unauthenticated = h.call("HEAD", "/api/imports", key=None)
    assert unauthenticated.status == 401 and unauthenticated.body == b""
    assert unauthenticated.header("Content-Length") == str(len(h.call("GET", "/api/imports", key=None).body))
    # Every route answers GET today; a 405 to HEAD goes through the same finish().
    from importer.handlers.edge import finish
    from importer.handlers.http import problem

    refused = finish("HEAD", problem("request.method_not_allowed", headers=(("Allow", "POST"),)), "rid-1")
    assert refused.status == 405 and refused.body == b"" and ("Allow", "POST") in refused.headers


def test_head_on_the_console_and_the_event_stream(h: Harness) -> None:
    page = h.call("HEAD", "/", key=None)
    assert page.status == 200 and page.body == b""
    assert page.header("Content-Length") == str(len(h.call("GET", "/", key=None).body))
    assert page.header("Cache-Control") == "no-cache"  # the console's own


@pytest.mark.parametrize("method,path,key", [
    ("GET", "/health", None), ("GET", "/api/imports/x", KEY_A), ("GET", "/api/imports/x", None),
    ("POST", "/api/imports", KEY_A), ("GET", "/nope", None), ("PUT", "/health", None),
])
def test_every_answer_carries_the_common_headers_and_a_request_id(h: Harness, method: str, path: str, key: str | None) -> None:
    result = h.call(method, path, key=key)
    for name, value in COMMON.items():
        assert result.header(name) == value
    assert len(result.header("X-Request-Id") or "") == 32


@pytest.mark.parametrize("incoming,kept", [
    ("lb-7f3a:0001", True), ("a" * 128, True), ("a" * 129, False), ("bad id", False), ("", False), ("-x", False),
])
def test_a_sane_incoming_request_id_is_kept(h: Harness, incoming: str, kept: bool) -> None:
    result = h.call("GET", "/health", headers=[("X-Request-Id", incoming)])
    assert (result.header("X-Request-Id") == incoming) is kept


def test_a_500_names_the_request_id_which_every_log_line_carries(h: Harness) -> None:
    h.store.failure = RuntimeError("boom at redis://10.0.0.1")  # not an "unavailable" error: a bug
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("importer")
    logger.addHandler(handler)
    try:
        result = h.call("GET", "/api/imports/shipment-x", headers=[("X-Request-Id", "req-500-test")])
    finally:
        logger.removeHandler(handler)

    problem = assert_problem(result, 500, "internal")
    assert problem["requestId"] == "req-500-test" == result.header("X-Request-Id")
    assert "10.0.0.1" not in result.body.decode()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines and all(line["requestId"] == "req-500-test" for line in lines)
    assert any("boom" in line.get("exc", "") for line in lines)


# -- no 500 from any body or header ----------------------------------------------------


@pytest.mark.parametrize("body,status,code", [
    (b'{"batchId":"b-1","csv":"A\\ud800"}', 422, "request.invalid"),
    (b'{"batchId":"b-\\ud800","csv":"x"}', 422, "request.invalid"),
    (b"[" * 100_000, 400, "request.bad_json"),
    (b'{"a":' * 100_000, 400, "request.bad_json"),
    (b"1" * 5000, 400, "request.bad_json"),
    (b'{"batchId":"b-1","csv":1' + b"0" * 400 + b"}", 422, "request.invalid"),
    (b'{"batchId":"b-1","csv":1e999}', 422, "request.invalid"),
    (b"\xff\xfe\x00", 400, "request.bad_json"),
])
def test_hostile_json_bodies_get_a_stable_4xx(body: bytes, status: int, code: str) -> None:
    h = make_harness()
    h.api.max_upload_bytes = 1024 * 1024
    h.app = create_app(h.api, _keys(h))
    result = h.call("POST", "/api/imports", body=body, content_type="application/json")
    assert_problem(result, status, code)
    assert h.store.jobs == {}


def test_a_lone_surrogate_in_the_serverless_authorization_header_is_a_401() -> None:
    h = make_harness()
    handler = make_handler(h.api, _keys(h))
    for value in ("Bearer imp_\ud800", "Bearer \udcff", "\ud800"):
        out = handler(_event("GET", "/api/imports/shipment-x", headers={"authorization": value}), None)
        assert out["statusCode"] == 401, value
    out = handler(_event("GET", "/api/imports/shipment-\ud800", headers={"authorization": f"Bearer {KEY_A}"}), None)
    assert out["statusCode"] == 404


_HEADER_NAMES = st.sampled_from([
    "Authorization", "Content-Type", "X-Request-Id", "Transfer-Encoding", "Accept", "X-Forwarded-For", "Cookie",
])
_PATHS = st.sampled_from(["/api/imports", "/api/imports/shipment-b-1", "/api/shipments/b-1", "/health", "/openapi.yaml", "/metrics", "/x"])
_METHODS = st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"])
_CONTENT_TYPES = st.sampled_from(["application/json", "text/csv", "application/csv", "text/plain", "", "application/json; charset=utf-8"])


#: Any code point, lone surrogates included (JSON can escape them: "\ud800").
_ANY_TEXT = st.one_of(
    st.text(max_size=200),
    st.text(alphabet=st.characters(categories=["Cs", "Lu", "Ll", "Nd", "Po", "Zs", "Cc"]), max_size=200),
)


def _json_bodies() -> st.SearchStrategy[bytes]:
    values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | _ANY_TEXT,
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
        max_leaves=12,
    )
    documents = st.one_of(
        values,
        st.fixed_dictionaries({"batchId": _ANY_TEXT, "csv": _ANY_TEXT}),
        st.fixed_dictionaries({"batchId": st.from_regex(r"[a-z0-9]{1,10}", fullmatch=True), "csv": _ANY_TEXT}),
    )
    return st.tuples(documents, st.booleans()).map(
        lambda pair: json.dumps(pair[0], ensure_ascii=pair[1]).encode("utf-8", "surrogatepass")
    )


_BODIES = st.one_of(st.binary(max_size=3000), _json_bodies(), st.text(max_size=500).map(lambda t: t.encode("utf-8", "surrogatepass")))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(method=_METHODS, path=_PATHS, ctype=_CONTENT_TYPES, body=_BODIES,
       headers=st.lists(st.tuples(_HEADER_NAMES, st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255), max_size=60)), max_size=4),
       authorized=st.booleans(), query=st.text(max_size=40))
def test_fuzz_the_wsgi_app_never_answers_5xx(method: str, path: str, ctype: str, body: bytes, headers: list[tuple[str, str]],
                                             authorized: bool, query: str) -> None:
    h = make_harness()
    extra = [(k, v) for k, v in headers if k not in ("Content-Type", "Transfer-Encoding")]
    result = h.call(method, path, key=KEY_A if authorized else None, body=body, content_type=ctype or None,
                    headers=extra, query=query.encode("utf-8", "surrogatepass").decode("latin-1"), validate=False)
    assert result.status < 500, result.body


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ctype=_CONTENT_TYPES, body=_BODIES, query=st.one_of(st.just("batchId=b-1"), st.text(max_size=40)), serverless=st.booleans())
def test_fuzz_enqueue_bodies_never_get_5xx(ctype: str, body: bytes, query: str, serverless: bool) -> None:
    """The authenticated POST, where the body is parsed: any bytes, any JSON (lone surrogates, deep nesting)."""
    h = make_harness()
    if serverless:
        event = _event("POST", "/api/imports", query=query,
                       headers={"authorization": f"Bearer {KEY_A}", "content-type": ctype})
        event["body"] = body.decode("utf-8", "surrogateescape")
        status = make_handler(h.api, _keys(h))(event, None)["statusCode"]
    else:
        status = h.call("POST", "/api/imports", body=body, content_type=ctype or None, validate=False,
                        query=query.encode("utf-8", "surrogatepass").decode("latin-1")).status
    assert status < 500


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(method=_METHODS, path=st.one_of(_PATHS, st.text(max_size=40).map(lambda t: "/" + t)), ctype=_CONTENT_TYPES,
       body=_BODIES, base64_body=st.booleans(),
       headers=st.dictionaries(st.one_of(_HEADER_NAMES.map(str.lower), st.text(max_size=10)), st.text(max_size=60), max_size=4),
       authorized=st.booleans(), query=st.text(max_size=40))
def test_fuzz_the_serverless_handler_never_answers_5xx(method: str, path: str, ctype: str, body: bytes, base64_body: bool,
                                                       headers: dict[str, str], authorized: bool, query: str) -> None:
    import base64

    h = make_harness()
    headers = {k: v for k, v in headers.items() if k not in ("content-length",)}
    if ctype:
        headers["content-type"] = ctype
    if authorized:
        headers["authorization"] = f"Bearer {KEY_A}"
    if base64_body:
        text, encoded = base64.b64encode(body).decode(), True
    else:
        text, encoded = body.decode("utf-8", "surrogateescape"), False
    event = _event(method, path, headers=headers, query=query)
    event["body"], event["isBase64Encoded"] = text, encoded
    out = make_handler(h.api, _keys(h))(event, None)
    assert out["statusCode"] < 500, out


# -- helpers ----------------------------------------------------------------------------


def _keys(h: Harness) -> Any:
    from importer.handlers.auth import KeyRing, hash_key

    return KeyRing.parse(f"owner-a:{hash_key(KEY_A)}")


def _event(method: str, path: str, *, body: str | None = None, query: str = "", headers: dict[str, str] | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {
        "version": "2.0", "routeKey": "$default", "rawPath": path, "rawQueryString": query,
        "headers": dict(headers or {}),
        "requestContext": {"http": {"method": method, "path": path}},
        "isBase64Encoded": False,
    }
    if body is not None:
        event["body"] = body
    return event


@pytest.mark.parametrize("shape", [b",", b"\n", b"A"])
def test_reading_a_body_costs_it_once(shape: bytes) -> None:
    """The read path alone (not the handler): one growing buffer handed over
    without a copy (with BytesIO's growth margin, 1/8), and one read chunk
    (1 MiB) in flight."""
    import tracemalloc

    from importer.handlers.wsgi import WsgiBody

    size = 8 * 1024 * 1024
    data = b"sku,quantity\n" + shape * (size - 13)
    environ = {"wsgi.input": io.BytesIO(data), "CONTENT_LENGTH": str(size)}
    tracemalloc.start()
    try:
        body = WsgiBody(environ).read(2 * size, lambda: None, float("inf"), lambda: None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert body == data
    assert peak <= 1.15 * size + 1.1 * 1024 * 1024, peak


def test_the_http_sides_redis_packer_sends_an_upload_without_copying_it() -> None:
    """hiredis packs a command into one new bytes (a copy of a 10 MiB upload);
    for a command carrying a large value the HTTP side's packer hands the
    value itself to the socket, and packs the same bytes."""
    from redis._parsers.encoders import Encoder
    from redis.connection import PythonRespSerializer

    from importer.adapters.bootstrap import LargeValuePacker

    packer = LargeValuePacker()
    upload = b"sku,quantity\n" + b"A,1\n" * 100_000
    pieces = packer.pack("EVALSHA", "abc", 1, "key", upload, 7)
    assert any(piece is upload for piece in pieces)
    assert b"".join(pieces) == b"".join(PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode).pack(
        "EVALSHA", "abc", 1, "key", upload, 7))
    small = packer.pack("GET", "key")
    assert b"".join(small) == b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n"


@pytest.mark.parametrize(
    "args",
    [
        ("EVALSHA", "a" * 40, 2, "{p}:job:1", "{p}:up:1", b"sku,quantity\nA,1\n", 7, 1.5, "naïve ✓"),
        ("SCRIPT LOAD", "return 1"),
        (b"GET", "key"),
        (b"CONFIG GET", "maxmemory"),
        ("SET", "key", bytearray(b"value"), "EX", 10),
        ("SET", "key", memoryview(b"value")),
        ("HSET", "h", "f", -3, "g", 0),
    ],
)
def test_the_redis_packer_packs_small_commands_as_hiredis_does(args: tuple[Any, ...]) -> None:
    from redis.connection import HiredisRespSerializer

    from importer.adapters.bootstrap import LargeValuePacker

    assert b"".join(LargeValuePacker().pack(*args)) == b"".join(HiredisRespSerializer().pack(*args))


def test_the_redis_packer_refuses_what_redis_py_refuses() -> None:
    from redis.exceptions import DataError

    from importer.adapters.bootstrap import LargeValuePacker

    with pytest.raises(DataError):
        LargeValuePacker().pack("SET", "key", {"not": "a value"})


def test_every_importer_redis_client_packs_with_the_large_value_packer() -> None:
    """The worker's clients too: its one-step script's ~60 arguments skip redis-py's two passes."""
    from importer.adapters.bootstrap import LargeValuePacker, redis_client
    from importer.adapters.settings import Settings

    client = redis_client(Settings.from_env({"IMPORTER_REDIS_URL": "redis://127.0.0.1:1/0"}))
    connection = client.connection_pool.make_connection()
    assert isinstance(connection._command_packer, LargeValuePacker)
