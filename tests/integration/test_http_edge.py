"""The HTTP edge against real servers (gunicorn via `importer serve`, and
waitress through the documented factory) with raw sockets where the point is
framing: a refused request reads no body, HEAD, the common headers, request
ids, JSON log lines. Cut uploads on every server: test_cut_uploads.py."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.integration.support import System, wait_for

pytestmark = pytest.mark.integration

ROWS = 100
FULL = b"sku,quantity\n" + b"".join(f"CUT-{n:03d},{100 + n}\n".encode() for n in range(ROWS))


@pytest.fixture(params=["gunicorn", "waitress"])
def server(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def edge_system(make_system: object, server: str) -> System:
    system = make_system()  # type: ignore[operator]
    system.start_worker()
    system.start_http(server=server)
    return system


def _port(system: System) -> int:
    return int(system.base_url.rsplit(":", 1)[1])


def _head(system: System, batch_id: str, extra: str, key: str | None = None) -> bytes:
    return (
        f"POST /api/imports?batchId={batch_id} HTTP/1.1\r\nHost: x\r\nContent-Type: text/csv\r\n"
        f"Authorization: Bearer {key or system.api_key}\r\n{extra}\r\n"
    ).encode()


def _answer(sock: socket.socket, timeout: float = 30) -> bytes:
    """Everything the server sends until it closes or stays silent."""
    sock.settimeout(timeout)
    data = b""
    try:
        while True:
            piece = sock.recv(65536)
            if not piece:
                return data
            data += piece
            if b"\r\n\r\n" in data:
                head, _, rest = data.partition(b"\r\n\r\n")
                length = [int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
                if length and len(rest) >= length[0]:
                    return data
    except (TimeoutError, ConnectionResetError):
        return data


def test_a_refused_request_reads_no_body(make_system: object) -> None:
    """A declared 20 MiB body (within the transport limit) with a wrong or no key
    gets its 401 while not one byte of the body was sent. (gunicorn: waitress
    buffers every body before it calls the app, up to --max-request-body-size.)"""
    s = make_system()  # type: ignore[operator]
    s.start_http()
    size = 20 * 1024 * 1024
    for key in ("imp_wrong", None):
        with socket.create_connection(("127.0.0.1", _port(s)), timeout=30) as sock:
            auth = f"Authorization: Bearer {key}\r\n" if key else ""
            sock.sendall(
                f"POST /api/imports?batchId=big HTTP/1.1\r\nHost: x\r\nContent-Type: text/csv\r\n{auth}"
                f"Content-Length: {size}\r\n\r\n".encode()
            )
            answer = _answer(sock, timeout=15)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert (b'"code":"auth.invalid"' if key else b'"code":"auth.required"') in answer


def test_head_common_headers_and_request_ids(edge_system: System) -> None:
    s = edge_system
    with socket.create_connection(("127.0.0.1", _port(s)), timeout=30) as sock:
        sock.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\nX-Request-Id: lb-probe-0001\r\n\r\n")
        time.sleep(0.5)
        sock.sendall(b"HEAD /api/imports HTTP/1.1\r\nHost: x\r\n" + f"Authorization: Bearer {s.api_key}\r\n\r\n".encode())
        time.sleep(0.5)
        sock.settimeout(5)
        data = b""
        try:
            while data.count(b"HTTP/1.1") < 2 or not data.endswith(b"\r\n\r\n"):
                piece = sock.recv(65536)
                if not piece:
                    break
                data += piece
        except TimeoutError:
            pass
    first, _, second = data.partition(b"\r\n\r\n")
    # HEAD /health: 200 like GET, no body; the probe's request id comes back.
    assert first.startswith(b"HTTP/1.1 200"), data
    assert b"X-Request-Id: lb-probe-0001" in first
    # HEAD on the list: 200 like GET, no body (else the two answers would not split cleanly).
    assert second.startswith(b"HTTP/1.1 200"), data
    assert b"Content-Length: " in second and second.endswith(b"\r\n\r\n")
    for path in ("/api/imports/shipment-nope", "/health", "/api/shipments/nope"):
        status, headers, body = s.request("GET", path)
        assert headers["Cache-Control"] == "no-store" and headers["X-Content-Type-Options"] == "nosniff", path
        assert len(headers["X-Request-Id"]) == 32
    status, headers, _ = s.request("GET", "/api/imports/x", key="imp_wrong")
    assert status == 401 and headers["Cache-Control"] == "no-store"


def test_every_log_line_is_json(make_system: object) -> None:
    system = make_system()  # type: ignore[operator]
    http = system.start_http(server="gunicorn")  # granian's lines: tests/integration/test_http_server.py
    # Make gunicorn itself log: a worker killed, restarted by the arbiter.
    master = http.popen.pid
    worker = int(Path(f"/proc/{master}/task/{master}/children").read_text().split()[0])
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: "Worker (pid:" in http.log() or "was sent SIGKILL" in http.log(), 30, message="gunicorn's line")
    wait_for(lambda: system.request("GET", "/health")[0] == 200, 30, message="new worker")
    http.stop()
    lines = [line for line in http.log().splitlines() if line.strip()]
    assert lines
    for line in lines:
        assert isinstance(json.loads(line), dict), line
    assert any(json.loads(line)["logger"] == "gunicorn.error" for line in lines)


def test_a_rate_limited_post_gets_its_429_before_its_body_is_sent(make_system: object) -> None:
    s = make_system(IMPORTER_RATE_LIMIT="1", IMPORTER_RATE_WINDOW="30")  # type: ignore[operator]
    s.start_http()
    assert s.post_csv("rl-1", FULL)[0] == 202
    with socket.create_connection(("127.0.0.1", _port(s)), timeout=30) as sock:
        sock.sendall(_head(s, "rl-2", f"Content-Length: {8 * 1024 * 1024}\r\n"))
        started = time.monotonic()
        answer = _answer(sock, timeout=15)
    assert answer.startswith(b"HTTP/1.1 429"), answer[:300]
    assert b'"code":"request.rate_limited"' in answer and b"retry-after: " in answer.lower()
    assert time.monotonic() - started < 5
    # Owner B has its own window.
    assert s.post_csv("rl-b", FULL, key=s.other_key)[0] == 202


def test_waitress_through_the_factory_refuses_bodies_over_the_limit(make_system: object) -> None:
    """waitress buffers a body before it calls the app: the factory sets its
    bound to the app's body limit (2 x upload + 4 KiB), not waitress's 1 GiB."""
    s = make_system(IMPORTER_MAX_UPLOAD_BYTES=str(1024 * 1024))  # type: ignore[operator]
    http = s.start_http(server="waitress")
    limit = 2 * 1024 * 1024 + 4096
    assert f'"max_request_body_size": {limit + 1}' in http.log()
    chunk = b"X" * (64 * 1024)
    sent = 0
    answer = b""
    with socket.create_connection(("127.0.0.1", _port(s)), timeout=30) as sock:
        sock.sendall(_head(s, "huge", "Transfer-Encoding: chunked\r\n"))
        try:
            while sent < 64 * 1024 * 1024:
                readable, writable, _ = select.select([sock], [sock], [], 5)
                if readable:
                    break
                if writable:
                    sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    sent += len(chunk)
            answer = _answer(sock, timeout=10)
        except (BrokenPipeError, ConnectionResetError):
            pass
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent <= 4 * limit  # refused near the limit, not at waitress's 1 GiB
    # A declared body at the limit is still taken.
    body = b"sku,quantity\n" + b"\n" * (1024 * 1024 - 13)
    assert s.post_csv("at-limit", body)[0] == 202
    # Every line waitress and the app wrote is JSON.
    for line in http.log().splitlines():
        if line.strip():
            assert isinstance(json.loads(line), dict), line


@pytest.mark.parametrize("server", ["granian", "gunicorn"])
def test_a_body_that_trickles_gets_408_and_slow_bodies_never_hold_every_thread(make_system: object, server: str) -> None:
    """With a valid key (the body is read): a body not whole within
    IMPORTER_HTTP_BODY_TIMEOUT gets 408 request.timeout and nothing is
    recorded (gunicorn: at the deadline, its socket times out; granian, whose
    read cannot be interrupted: when the read returns, here when the rest
    arrives late); while IMPORTER_MAX_BODY_READS slow bodies are being read,
    one more POST gets 503 service.busy at once and GETs are served."""
    s = make_system(IMPORTER_HTTP_BODY_TIMEOUT="1.5", IMPORTER_MAX_BODY_READS="1", IMPORTER_RATE_LIMIT="0")  # type: ignore[operator]
    s.start_http(server=server, workers=1)
    declared = len(FULL)
    slow = socket.create_connection(("127.0.0.1", _port(s)), timeout=30)
    try:
        slow.sendall(_head(s, "slow-1", f"Content-Length: {declared}\r\n") + FULL[:10])
        time.sleep(0.3)  # the slow body holds the one body-read slot
        busy = socket.create_connection(("127.0.0.1", _port(s)), timeout=30)
        with busy:
            busy.sendall(_head(s, "busy-1", f"Content-Length: {declared}\r\n"))
            answer = _answer(busy, timeout=10)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:300]
        assert b'"code":"service.busy"' in answer
        started = time.monotonic()
        assert s.request("GET", "/health")[0] == 200
        assert s.request("GET", "/api/imports/shipment-nope", key=s.other_key)[0] == 404
        assert time.monotonic() - started < 1
        for n in range(3):  # a byte now and then: still too slow
            time.sleep(0.3)
            slow.sendall(FULL[10 + n:11 + n])
        if server == "granian":
            time.sleep(1.0)  # past the deadline, then the rest
            slow.sendall(FULL[13:])
        answer = _answer(slow, timeout=10)
    finally:
        slow.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b'"code":"request.timeout"' in answer
    assert s.request("GET", "/api/imports/shipment-slow-1")[0] == 404
    # The client went away: its slot is free again, a whole body is taken.
    wait_for(lambda: s.post_csv("slow-1", FULL)[0] == 202, 10, 0.2, message="slot back")
    http = next(p for p in s.procs if p.name == "http")
    assert "http.body_timeout" in http.log() and "http.body_reads_busy" in http.log()
