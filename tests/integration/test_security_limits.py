"""owners, error exposure, limits, the Redis guard, metrics."""

from __future__ import annotations

import json
import re
import select
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from importer.adapters.redis.embedded import EmbeddedRedis
from importer.handlers.api import RATE_TOKEN_WITH_ENQUEUE_BYTES
from tests.integration.support import FIXTURES, ROOT, System, free_port, wait_for

pytestmark = pytest.mark.integration

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()
BAD = (FIXTURES / "invalid-bad-quantity.csv").read_bytes()

STATUS_FIELDS = {
    "id", "batchId", "location", "state", "attempt", "progress", "result", "error",
    "createdAt", "updatedAt", "startedAt", "finishedAt", "nextAttemptAt", "retries", "retryable",
}
ERROR_FIELDS = {"code", "message", "issues", "issuesTruncated", "rejections"}
FORBIDDEN = re.compile(
    r"Traceback|File \"|\.py\b|redis(s)?://|\b\d{1,3}(\.\d{1,3}){3}\b|\{t[0-9a-f]+\}|:job:|:done:|/usr/|/tmp/|/work/"
    r"|dramatiq|Exception|Error\b|TimeLimit"
)


def assert_clean_status(body: bytes) -> dict:
    text = body.decode()
    assert not FORBIDDEN.search(text), text
    record = json.loads(text)
    assert set(record) <= STATUS_FIELDS
    if record["error"] is not None:
        assert set(record["error"]) <= ERROR_FIELDS
    return record


def test_authorization_matrix(system: System) -> None:
    system.post_csv("mine-1", SEED)
    system.post_csv("mine-bad", BAD)
    system.wait_state("shipment-mine-1")
    system.wait_state("shipment-mine-bad")
    b = {"key": system.other_key}

    def body_of(path: str, **kw: object) -> tuple[int, bytes]:
        status, _, body = system.request("GET", path, **kw)  # type: ignore[arg-type]
        return status, body

    missing_job = body_of("/api/imports/shipment-no-such-batch", **b)
    missing_shipment = body_of("/api/shipments/no-such-batch", **b)
    assert missing_job[0] == 404 and missing_shipment[0] == 404
    for job in ("shipment-mine-1", "shipment-mine-bad"):
        assert body_of(f"/api/imports/{job}", **b) == missing_job
        assert body_of(f"/api/imports/{job}")[0] == 200
    assert body_of("/api/shipments/mine-1", **b) == missing_shipment
    assert body_of("/api/shipments/mine-1")[0] == 200
    # Owner B cannot take A's batchId, and learns nothing about it.
    status, problem = system.post_csv("mine-1", SEED, key=system.other_key)
    assert (status, problem["code"]) == (409, "batch.conflict")
    assert "owner-a" not in json.dumps(problem) and "WIDGET" not in json.dumps(problem)

    for path in ("/api/imports/shipment-mine-1", "/api/shipments/mine-1"):
        for key in (None, "imp_not-a-real-key", ""):
            status, headers, body = system.request("GET", path, key=key)
            assert status == 401, (path, key)
            assert headers["WWW-Authenticate"].startswith("Bearer")
            assert json.loads(body)["code"] == ("auth.invalid" if key else "auth.required")
    status, headers, _ = system.request(
        "POST", "/api/imports?batchId=x", body=SEED, ctype="text/csv", key=None
    )
    assert status == 401
    assert system.request("GET", "/health", key=None)[0] == 200
    assert system.request("GET", "/openapi.yaml", key=None)[0] == 200

    record = assert_clean_status(system.request("GET", "/api/imports/shipment-mine-bad")[2])
    assert record["error"]["code"] == "csv.bad_quantity"


def test_a_transient_failure_shows_a_code_never_the_traceback(make_system: object) -> None:
    system = make_system(IMPORTER_TIME_LIMIT="1")  # type: ignore[operator]
    system.start_http()
    worker = system.start_worker(IMPORTER_FAULT="before_apply:3")
    system.post_csv("slow-1", SEED)
    retrying = system.wait_state("shipment-slow-1", ("retrying",), timeout=20)
    assert retrying["error"]["code"] == "import.time_limit" and retrying["nextAttemptAt"]
    record = system.wait_state("shipment-slow-1", timeout=60)
    assert (record["state"], record["attempt"], record["error"]["code"]) == ("failed", 3, "import.time_limit")
    assert_clean_status(system.request("GET", "/api/imports/shipment-slow-1")[2])
    assert system.store().generation() == 0
    # The operator sees the diagnostic; the traceback is in the log.
    out = subprocess.run(
        [sys.executable, "-m", "importer.adapters.processes.cli", "inspect", "shipment-slow-1"],
        env=system.env, cwd=ROOT, capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0 and "TimeLimitExceeded" in json.loads(out.stdout)["diagnostic"]
    assert "Traceback" in worker.log()
    assert "WIDGET-RED-01" not in worker.log()  # logs never copy CSV content


def _worker_pids(master: int) -> list[int]:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return [int(pid) for pid in children]


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_1_gib_streamed_upload_is_refused_with_bounded_memory(make_system: object) -> None:
    system = make_system()  # type: ignore[operator]
    http = system.start_http()
    port = int(system.base_url.rsplit(":", 1)[1])
    chunk = (b"sku,quantity\n" + b"X" * (1024 * 1024 - 13))
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"POST /api/imports?batchId=huge HTTP/1.1\r\nHost: x\r\nContent-Type: text/csv\r\n"
            # With a digest: granian refuses a chunked body without one (411) unread.
            + f"Authorization: Bearer {system.api_key}\r\nTransfer-Encoding: chunked\r\n".encode()
            + b"Content-Digest: sha-256=:" + b"A" * 43 + b"=:\r\n\r\n"
        )
        response = b""
        piece = 64 * 1024  # sent in small pieces, watching for the early answer between them
        try:
            while sent < 1024 * 1024 * 1024:
                framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
                for start in range(0, len(framed), piece):
                    if select.select([sock], [], [], 0)[0]:
                        break
                    sock.sendall(framed[start:start + piece])
                else:
                    sent += len(chunk)
                    continue
                break
            while b"request.too_large" not in response:
                data = sock.recv(65536)
                if not data:
                    break
                response += data
        except (BrokenPipeError, ConnectionResetError):
            response = response or b""
    assert response.startswith(b"HTTP/1.1 413"), response[:200]
    assert b"request.too_large" in response
    assert sent < 100 * 1024 * 1024  # refused long before the end of the gigabyte
    # A declared 1 GiB Content-Length is refused before a byte is read.
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"POST /api/imports?batchId=huge HTTP/1.1\r\nHost: x\r\nContent-Type: text/csv\r\n"
            + f"Authorization: Bearer {system.api_key}\r\nContent-Length: {1024 ** 3}\r\n\r\n".encode()
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 413")
    peaks = [_peak_rss_mb(pid) for pid in _worker_pids(http.popen.pid)]
    assert peaks and max(peaks) < 100, peaks


def test_row_limit_and_encoding_errors_fail_cleanly(system: System) -> None:
    rows = b"".join(f"R{n},1\n".encode() for n in range(100_001))
    system.post_csv("too-many", b"sku,quantity\n" + rows)
    system.post_csv("not-utf8", (FIXTURES / "invalid-not-utf8.csv").read_bytes())
    too_many = system.wait_state("shipment-too-many")
    not_utf8 = system.wait_state("shipment-not-utf8")
    assert (too_many["state"], too_many["error"]["code"]) == ("failed", "csv.too_many_rows")
    assert (not_utf8["state"], not_utf8["error"]["code"]) == ("failed", "csv.not_utf8")
    assert system.store().generation() == 0
    assert system.store().stock_of(["R0", "R100000"]) == {"R0": 0, "R100000": 0}


def test_rate_limit_per_owner(make_system: object) -> None:
    system = make_system(IMPORTER_RATE_LIMIT="5", IMPORTER_RATE_WINDOW="30")  # type: ignore[operator]
    system.start_http(workers=2)
    statuses = [system.request("POST", f"/api/imports?batchId=rl-{n}", body=SEED, ctype="text/csv") for n in range(7)]
    assert [s[0] for s in statuses[:5]] == [202] * 5
    status, headers, body = statuses[5]
    assert status == 429 and json.loads(body)["code"] == "request.rate_limited"
    assert 1 <= int(headers["Retry-After"]) <= 30
    assert statuses[6][0] == 429
    assert [system.get_job(f"shipment-rl-{n}")[0] for n in (5, 6)] == [404, 404]  # nothing recorded past the limit

    # Small bodies have their token taken by the enqueue script, larger ones before
    # the body is read: one counter all the same. The other owner: 3 small, 1 large, 1 small, then refused.
    large = b"sku,quantity\n" + b"".join(f"LARGE-{n:06d},1\n".encode() for n in range(5000))
    assert len(large) > RATE_TOKEN_WITH_ENQUEUE_BYTES
    other = system.other_key
    sent = [system.request("POST", f"/api/imports?batchId=rl-b{n}", body=SEED, ctype="text/csv", key=other)[0] for n in range(3)]
    sent.append(system.request("POST", "/api/imports?batchId=rl-large", body=large, ctype="text/csv", key=other)[0])
    sent.append(system.request("POST", "/api/imports?batchId=rl-b3", body=SEED, ctype="text/csv", key=other)[0])
    assert sent == [202] * 5
    assert system.request("POST", "/api/imports?batchId=rl-large-2", body=large, ctype="text/csv", key=other)[0] == 429
    assert system.request("POST", "/api/imports?batchId=rl-b4", body=SEED, ctype="text/csv", key=other)[0] == 429


def test_an_evicting_redis_is_refused_unless_overridden(tmp_path: Path, make_system: object) -> None:
    server = EmbeddedRedis(tmp_path / "lru", maxmemory_policy="allkeys-lru")
    url = server.start()
    try:
        system = make_system(IMPORTER_REDIS_URL=url)  # type: ignore[operator]
        for command in (["serve", "--bind", f"127.0.0.1:{free_port()}"], ["worker"]):
            out = subprocess.run(
                [sys.executable, "-m", "importer.adapters.processes.cli", *command], env=system.env, cwd=ROOT,
                capture_output=True, text=True, timeout=60,
            )
            assert out.returncode != 0
            last = out.stderr.strip().splitlines()[-1]
            assert last.startswith("importer: Redis maxmemory-policy is allkeys-lru; Importer requires noeviction"), out.stderr
        worker = system.start_worker(IMPORTER_ALLOW_EVICTION="1")
        http = system.start_http(IMPORTER_ALLOW_EVICTION="1")
        assert "redis.eviction_allowed" in worker.log() and "redis.eviction_allowed" in http.log()
        system.stop_all()
    finally:
        server.stop()


def _metrics(system: System, token: str) -> dict[tuple[str, tuple], float]:
    status, _, body = system.request("GET", "/metrics", key=token)
    assert status == 200, body
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_count_a_completed_and_a_failed_import(make_system: object) -> None:
    system = make_system(IMPORTER_METRICS_TOKEN="metrics-secret")  # type: ignore[operator]
    system.start_worker()
    system.start_http()
    assert system.request("GET", "/metrics", key=None)[0] == 401
    assert system.request("GET", "/metrics", key=system.api_key)[0] == 401  # a producer key is not enough
    system.post_csv("m-warmup", b"sku,quantity\nWARM,1\n")
    system.wait_state("shipment-m-warmup")
    before = _metrics(system, "metrics-secret")
    system.post_csv("m-ok", SEED)
    system.post_csv("m-bad", BAD)
    system.wait_state("shipment-m-ok")
    system.wait_state("shipment-m-bad")
    after = _metrics(system, "metrics-secret")

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    assert delta("importer_jobs_completed_total") == 1
    assert delta("importer_jobs_failed_total", code="csv.bad_quantity") == 1
    assert delta("importer_rows_applied_total") == 3
    assert delta("importer_attempt_duration_seconds_count") == 2
    assert after[("importer_jobs_waiting", ())] == 0
    assert after[("importer_redis_up", ())] == 1


def test_metrics_are_off_without_a_token(system: System) -> None:
    for key in (None, system.api_key, ""):
        status, _, body = system.request("GET", "/metrics", key=key)
        assert status == 401 and json.loads(body)["code"] == "auth.required"


def test_doctor_prints_a_checklist(system: System) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "importer.adapters.processes.cli", "doctor"], env=system.env, cwd=ROOT,
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for item in ("Redis reachable", "maxmemory-policy: noeviction", "persistence", "queue", "oldest waiting job"):
        assert item in out.stdout
    wait_for(lambda: "1 worker process(es)" in subprocess.run(
        [sys.executable, "-m", "importer.adapters.processes.cli", "doctor"], env=system.env, cwd=ROOT,
        capture_output=True, text=True, timeout=30,
    ).stdout, 10, 0.5, message="doctor sees the worker")


def test_a_flood_at_undeclared_locations_answers_404_and_writes_nothing(make_system: object) -> None:
    """Retries and POSTs at random undeclared locations used to register each one (2,000
    retries left 2,008 locations, and the idle server ran 40x the commands): now every
    one answers as a missing one, and Redis's keys and its idle command rate stay as they were."""
    import random
    import time

    system = make_system(IMPORTER_RATE_LIMIT="0")  # type: ignore[operator]
    system.start_worker()
    system.start_http()
    status, _, body = system.request("POST", "/api/imports?batchId=declared-1&location=paris", body=SEED, ctype="text/csv")
    assert status == 202, body  # a declared location works
    system.wait_state("shipment-declared-1@paris")
    client = system.store().client

    def keys() -> set[bytes]:
        return set(client.scan_iter(match=f"{system.prefix}*", count=1000))

    def idle_commands_per_s(seconds: float = 3.0) -> float:
        before = int(client.info("stats")["total_commands_processed"])
        time.sleep(seconds)
        return (int(client.info("stats")["total_commands_processed"]) - before - 1) / seconds

    time.sleep(2)  # the first reconciler and upkeep passes are behind us
    keys_before, rate_before = keys(), idle_commands_per_s()
    registry_before = client.smembers(f"{system.prefix}locations")
    rng = random.Random(37)
    for n in range(150):
        location = f"x{rng.getrandbits(40):x}"
        status, _, body = system.request("POST", f"/api/imports/shipment-b{n}@{location}/retry")
        assert status == 404 and json.loads(body)["code"] == "job.not_found", body
        status, _, body = system.request("POST", f"/api/imports?batchId=b{n}&location={location}", body=SEED, ctype="text/csv")
        assert status == 404 and json.loads(body)["code"] == "location.not_found", body
        status, _, body = system.request("GET", f"/api/imports?location={location}")
        assert status == 200 and json.loads(body)["items"] == [], body
    assert client.smembers(f"{system.prefix}locations") == registry_before
    grown = {k for k in keys() - keys_before if b":rate:" not in k}  # none: the rate limit is off
    assert not grown, sorted(grown)[:10]
    rate_after = idle_commands_per_s()
    assert rate_after <= rate_before * 1.5 + 5, (rate_before, rate_after)
    print(f"[security] 450 requests at 150 undeclared locations: no key, idle commands {rate_before:.0f}/s -> {rate_after:.0f}/s")
