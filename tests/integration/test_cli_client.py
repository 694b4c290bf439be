"""`importer submit --wait` and `importer status`, as a person uses them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.support import FIXTURES, ROOT, System

pytestmark = pytest.mark.integration


def importer(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**system.env, "IMPORTER_API_KEY": system.api_key, "IMPORTER_URL": system.base_url}
    return subprocess.run(
        [sys.executable, "-m", "importer.adapters.processes.cli", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_submit_wait_follows_a_good_import_to_completion(system: System) -> None:
    out = importer(system, "submit", str(FIXTURES / "shipment-a-2026.csv"), "--batch-id", "cli-1", "--wait")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "accepted shipment-cli-1 (batch cli-1 at main, waiting)"
    assert lines[-1] == 'completed shipment-cli-1: {"imported": 3, "batchId": "cli-1"}'
    assert any(line.startswith("completed phase=committed rows=3 attempt=1") for line in lines)

    status = importer(system, "status", "shipment-cli-1", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "completed"
    readable = importer(system, "status", "shipment-cli-1")
    assert readable.stdout.startswith("shipment-cli-1: completed (attempt 1, phase committed, rows 3)")


def test_submit_to_another_location(system: System) -> None:
    out = importer(system, "submit", str(FIXTURES / "shipment-a-2026.csv"), "--batch-id", "cli-1", "--location", "oslo", "--wait")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "accepted shipment-cli-1@oslo (batch cli-1 at oslo, waiting)"
    assert lines[-1] == 'completed shipment-cli-1@oslo: {"imported": 3, "batchId": "cli-1"}'
    bad = importer(system, "submit", str(FIXTURES / "shipment-a-2026.csv"), "--batch-id", "cli-2", "--location", "Oslo")
    assert bad.returncode != 0 and "location" in bad.stderr


def test_submit_wait_prints_each_located_issue_of_a_bad_file(system: System) -> None:
    out = importer(system, "submit", str(FIXTURES / "invalid-bad-quantity.csv"), "--batch-id", "cli-bad", "--wait")
    assert out.returncode == 1
    assert "failed shipment-cli-bad: csv.bad_quantity:" in out.stdout
    assert "  line 2, column 2: csv.bad_quantity: quantity 'abc'" in out.stdout
    assert "  line 3, column 2: csv.bad_quantity: quantity '-3'" in out.stdout


def test_refusals_and_missing_jobs_exit_non_zero(system: System) -> None:
    importer(system, "submit", str(FIXTURES / "shipment-a-2026.csv"), "--batch-id", "cli-2", "--wait")
    conflict = importer(system, "submit", str(FIXTURES / "invalid-duplicate-sku.csv"), "--batch-id", "cli-2")
    assert conflict.returncode == 1 and "409 batch.conflict" in conflict.stderr
    missing = importer(system, "status", "shipment-nope")
    assert missing.returncode == 1 and "404 job.not_found" in missing.stderr


@pytest.mark.parametrize("server", ["granian", "gunicorn"])
def test_submit_of_a_large_file_hears_an_early_refusal(make_system: object, server: str, tmp_path: Path) -> None:
    """The server refuses a wrong key before it reads the body and closes; the
    CLI (Expect: 100-continue, stops sending on an early answer) prints the
    401 problem instead of a connection reset. So do 503 busy and 429."""
    s = make_system(IMPORTER_RATE_LIMIT="1", IMPORTER_RATE_WINDOW="60")  # type: ignore[operator]
    s.start_http(server=server)
    big = tmp_path / "big.csv"
    big.write_bytes(b"sku,quantity\n" + b"".join(b"BIG-%06d,1\n" % n for n in range(400_000)))  # 5 MiB
    assert big.stat().st_size > 4 * 1024 * 1024
    wrong = {**s.env, "IMPORTER_API_KEY": "imp_wrong", "IMPORTER_URL": s.base_url}
    out = subprocess.run(
        [sys.executable, "-m", "importer.adapters.processes.cli", "submit", str(big), "--batch-id", "big-1"],
        env=wrong, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr.startswith("refused: 401 auth.invalid: "), out.stderr
    # The owner's one POST of the window is used by a small file; the large one gets its 429.
    assert importer(s, "submit", str(FIXTURES / "shipment-a-2026.csv"), "--batch-id", "big-0").returncode == 0
    limited = importer(s, "submit", str(big), "--batch-id", "big-2")
    assert limited.returncode == 1 and limited.stderr.startswith("refused: 429 request.rate_limited: "), limited.stderr


def test_submit_sends_the_files_content_digest(tmp_path: Path) -> None:
    """`importer submit` proves its upload whole (RFC 9530 Content-Digest):
    a listener in place of the server reads the request it sends."""
    import base64
    import hashlib
    import socket
    import threading

    data = (FIXTURES / "shipment-a-2026.csv").read_bytes()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    seen: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            while len(request.partition(b"\r\n\r\n")[2]) < len(data):
                request += conn.recv(65536)
            seen.append(request)
            answer = b'{"jobId":"shipment-dig","batchId":"dig","state":"waiting"}'
            conn.sendall(b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(answer)).encode() + b"\r\n\r\n" + answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    env = {"PATH": "/usr/bin:/bin", "IMPORTER_API_KEY": "imp_x", "IMPORTER_URL": f"http://127.0.0.1:{port}"}
    out = subprocess.run([sys.executable, "-m", "importer.adapters.processes.cli", "submit", str(FIXTURES / "shipment-a-2026.csv"),
                          "--batch-id", "dig"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    thread.join(10)
    listener.close()
    assert out.returncode == 0, out.stdout + out.stderr
    head, _, body = seen[0].partition(b"\r\n\r\n")
    headers = {line.split(b":", 1)[0].lower(): line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")[1:]}
    assert body == data
    assert headers[b"content-digest"] == b"sha-256=:" + base64.b64encode(hashlib.sha256(data).digest()) + b":"
