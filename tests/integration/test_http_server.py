"""`importer serve` under granian: slow clients hold no Python thread, header
blocks that never end are cut, the upload limit holds, JSON log lines."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.integration.support import System, wait_for

pytestmark = pytest.mark.integration


def _port(system: System) -> int:
    return int(system.base_url.rsplit(":", 1)[1])


def _slow_header_clients(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"POST /api/imports?batchId=slow HTTP/1.1\r\nHost: x\r\nX-Pad: a")
        socks.append(sock)
    return socks


def test_64_slow_header_clients_leave_health_answering(make_system: object) -> None:
    system = make_system()  # type: ignore[operator]
    system.start_http(workers=1)
    port = _port(system)
    socks = _slow_header_clients(port, 64)
    try:
        # One byte per second on every slow connection, while /health is asked.
        latencies = []
        for i in range(40):
            for sock in socks:
                sock.sendall(b"a")
            t0 = time.perf_counter()
            status, _, body = system.request("GET", "/health", key=None)
            latencies.append(time.perf_counter() - t0)
            assert (status, json.loads(body)["status"]) == (200, "ok")
            time.sleep(0.025 if i % 40 else 0)
        # Under gunicorn gthread (1 worker x 4 threads here) these requests
        # wait behind the slow connections and time out; generous bound for
        # a loaded machine, the measured p99 is a few ms.
        assert max(latencies) < 2.0, latencies
    finally:
        for sock in socks:
            sock.close()


def test_a_header_block_that_never_ends_is_cut(make_system: object) -> None:
    system = make_system(IMPORTER_HTTP_HEADER_TIMEOUT="1")  # type: ignore[operator]
    system.start_http(workers=1)
    sock = _slow_header_clients(_port(system), 1)[0]
    try:
        sock.settimeout(15)
        t0 = time.monotonic()
        got = b""
        try:
            while True:
                sock.sendall(b"a")
                sock.settimeout(0.5)
                try:
                    chunk = sock.recv(4096)
                except socket.timeout:
                    continue
                if not chunk:
                    break
                got += chunk
                if time.monotonic() - t0 > 15:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert time.monotonic() - t0 < 15, "the connection was never cut"
        assert b"202" not in got
    finally:
        sock.close()


ANY_DIGEST = "sha-256=:" + "A" * 43 + "=:"


def test_upload_limits_hold_under_granian(make_system: object) -> None:
    system = make_system(IMPORTER_MAX_UPLOAD_BYTES="65536")  # type: ignore[operator]
    system.start_http(workers=1)
    port = _port(system)
    head = f"POST /api/imports?batchId=huge HTTP/1.1\r\nHost: x\r\nContent-Type: text/csv\r\nAuthorization: Bearer {system.api_key}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall((head + f"Content-Length: {1024 ** 3}\r\n\r\n").encode())
        assert sock.recv(65536).startswith(b"HTTP/1.1 413")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        # With a digest (granian refuses a chunked body without one: 411), the
        # stream is still cut off at the limit, long before the digest is checked.
        sock.sendall((head + f"Content-Digest: {ANY_DIGEST}\r\nTransfer-Encoding: chunked\r\n\r\n").encode())
        chunk = b"A,1\n" * 4096
        sent, answer = 0, b""
        sock.settimeout(0.05)
        try:
            while sent < 64 * 1024 * 1024 and not answer:
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                sent += len(chunk)
                try:
                    answer = sock.recv(65536)
                except socket.timeout:
                    pass
        except (BrokenPipeError, ConnectionResetError):
            sock.settimeout(5)
            answer = answer or sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413"), (sent, answer[:80])
        assert sent < 8 * 1024 * 1024  # read up to the limit, not to the end
    assert system.store().get_job("shipment-huge") is None


def test_granian_lines_are_json_and_a_dead_worker_is_replaced(make_system: object) -> None:
    system = make_system()  # type: ignore[operator]
    http = system.start_http(workers=1)
    main = http.popen.pid
    worker = int(Path(f"/proc/{main}/task/{main}/children").read_text().split()[0])
    os.kill(worker, signal.SIGKILL)  # granian itself logs, then starts a new worker
    wait_for(lambda: "Unexpected exit" in http.log(), 30, message="granian's line")
    wait_for(lambda: system.request("GET", "/health", key=None)[0] == 200, 30, message="new worker")
    assert http.stop() == 0
    lines = [line for line in http.log().splitlines() if line.strip()]
    for line in lines:
        assert isinstance(json.loads(line), dict), line
    assert any(json.loads(line)["logger"] == "_granian" for line in lines)
    assert "http.closed" in http.log()
