"""retention, durable shipment history, the events observer, and
graceful shutdown of the worker, the HTTP server and the observer."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import redis

from importer.adapters.redis.embedded import EmbeddedRedis
from importer.domain.shipment import job_id_for
from tests.integration.support import FIXTURES, ROOT, Proc, System, free_port, wait_for

pytestmark = pytest.mark.integration

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()
BAD = (FIXTURES / "invalid-bad-quantity.csv").read_bytes()


def csv_for(n: int) -> bytes:
    return f"sku,quantity\nLIFE-{n},{n + 1}\n".encode()


def import_and_wait(system: System, batch: str, data: bytes) -> dict:
    assert system.post_csv(batch, data)[0] == 202
    return system.wait_state(job_id_for(batch))


def test_retention_by_count_keeps_the_newest_and_never_the_history(make_system: object) -> None:
    system = make_system(  # type: ignore[operator]
        IMPORTER_KEEP_COMPLETED_COUNT="3", IMPORTER_KEEP_FAILED_COUNT="2",
        IMPORTER_KEEP_COMPLETED_AGE="3600", IMPORTER_KEEP_FAILED_AGE="3600",
    )
    system.start_worker()
    system.start_http()
    batches = [f"keep-{n}" for n in range(8)]
    for n, batch in enumerate(batches):
        assert import_and_wait(system, batch, csv_for(n))["state"] == "completed"
    failed = [f"bad-{n}" for n in range(3)]
    for batch in failed:
        assert import_and_wait(system, batch, BAD)["state"] == "failed"

    # Retention runs in the reconciler's pass (every 0.5 s here).
    wait_for(lambda: system.get_job(job_id_for(batches[4]))[0] == 404, 10, message="retention of completed")
    wait_for(lambda: system.get_job(job_id_for(failed[0]))[0] == 404, 10, message="retention of failed")
    gone = [system.get_job(job_id_for(b)) for b in batches[:5]]
    assert all(status == 404 for status, _ in gone)
    assert gone[0][1]["code"] == "job.not_found"
    assert "retention" in gone[0][1]["detail"] and "/api/shipments/" in gone[0][1]["detail"]
    assert all(system.get_job(job_id_for(b))[0] == 200 for b in batches[5:])
    assert system.get_job(job_id_for(failed[0]))[0] == 404
    assert all(system.get_job(job_id_for(b))[0] == 200 for b in failed[1:])

    # The durable history answers for every applied batch, whatever retention did.
    for n, batch in enumerate(batches):
        status, _, body = system.request("GET", f"/api/shipments/{batch}")
        shipment = json.loads(body)
        assert status == 200, shipment
        assert shipment["state"] == "applied" and shipment["result"] == {"imported": 1, "batchId": batch}
        assert len(shipment["contentSha256"]) == 64
        assert datetime.fromisoformat(shipment["appliedAt"]).tzinfo is not None
    assert system.request("GET", "/api/shipments/bad-0")[0] == 404
    assert system.request("GET", "/api/shipments/never-sent")[0] == 404

    store = system.store()
    assert len(list(store.client.scan_iter(match=store.keys.done("*").replace("{", "\\{").replace("}", "\\}")))) == 8
    # Uploads are freed: completed at completion, failed with their records.
    uploads = list(store.client.scan_iter(match=store.keys.upload("*").replace("{", "\\{").replace("}", "\\}")))
    assert len(uploads) == 2

    # Posting a removed batch again replays; nothing is added.
    record = import_and_wait(system, batches[0], csv_for(0))
    assert record["result"] == {"imported": 1, "batchId": batches[0], "replay": True}
    assert store.stock_of(["LIFE-0"]) == {"LIFE-0": 1}


def test_retention_by_age(make_system: object) -> None:
    system = make_system(IMPORTER_KEEP_COMPLETED_AGE="2", IMPORTER_KEEP_COMPLETED_COUNT="100")  # type: ignore[operator]
    system.start_worker()
    system.start_http()
    import_and_wait(system, "old-1", csv_for(1))
    time.sleep(2.5)
    import_and_wait(system, "new-1", csv_for(2))
    wait_for(lambda: system.get_job("shipment-old-1")[0] == 404, 10, message="retention by age")
    assert system.get_job("shipment-new-1")[0] == 200
    assert system.request("GET", "/api/shipments/old-1")[0] == 200


def test_the_events_stream_stays_within_its_bound(make_system: object) -> None:
    system = make_system(IMPORTER_EVENTS_MAXLEN="20")  # type: ignore[operator]
    system.start_worker()
    system.start_http()
    jobs = 40  # 5 events each: 200 events written
    for n in range(jobs):
        assert system.post_csv(f"ev-{n}", csv_for(n))[0] == 202
    for n in range(jobs):
        system.wait_state(f"shipment-ev-{n}")
    length = system.store().client.xlen(system.store().keys.events)
    # MAXLEN ~ trims whole stream nodes (100 entries by default): the bound
    # is approximate, never unbounded.
    assert length <= 20 + 100 and length < jobs * 5


def _observer(system: System, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    out = system.workdir / f"events-{len(system.procs)}.out"
    with open(out, "wb") as handle, open(str(out) + ".log", "wb") as errors:
        popen = subprocess.Popen(
            [sys.executable, "-m", "importer.adapters.processes.cli", "events", *extra],
            env=system.env, cwd=ROOT, stdout=handle, stderr=errors, start_new_session=True,
        )
    system.procs.append(Proc("events", popen, Path(str(out) + ".log")))
    wait_for(lambda: "events.watching" in Path(str(out) + ".log").read_text(), 20, message="observer ready")
    return popen, out


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


def test_the_observer_sees_every_job_of_two_workers_in_order_and_resumes(make_system: object) -> None:
    system = make_system()  # type: ignore[operator]
    observer, out = _observer(system, "--json")
    plain, plain_out = _observer(system)
    # A short honest delay per import so both workers get a share.
    w1 = system.start_worker(threads=1, IMPORTER_FAULT="before_apply:0.2")
    w2 = system.start_worker(threads=1, IMPORTER_FAULT="before_apply:0.2")
    system.start_http()
    batches = [f"obs-{n}" for n in range(8)]
    for n, batch in enumerate(batches):
        system.post_csv(batch, csv_for(n) if n != 3 else BAD)
    for batch in batches:
        system.wait_state(job_id_for(batch))
    assert "fault.injected" in w1.log() and "fault.injected" in w2.log()  # both took imports

    def complete() -> bool:
        return sum(1 for line in _lines(out) if json.loads(line)["event"] in ("completed", "failed")) == len(batches)

    wait_for(complete, 10, message="observer saw every outcome")
    events = [json.loads(line) for line in _lines(out)]
    for n, batch in enumerate(batches):
        mine = [e for e in events if e["jobId"] == job_id_for(batch)]
        kinds = [e["event"] if e["event"] != "progress" else e["data"]["phase"] for e in mine]
        if n == 3:
            assert kinds == ["waiting", "active", "failed"]
            assert mine[-1]["data"]["code"] == "csv.bad_quantity"
        else:
            assert kinds == ["waiting", "active", "validated", "committed", "completed"]
            assert all(e["attempt"] == 1 for e in mine[1:])
    text = plain_out.read_text()
    assert 'progress shipment-obs-0 {"phase":"validated","rows":1} attempt=1' in text
    assert "completed shipment-obs-0" in text
    assert "failed shipment-obs-3 csv.bad_quantity" in text

    observer.send_signal(signal.SIGTERM)
    assert observer.wait(timeout=10) == 0
    last_id = events[-1]["id"]
    for n in range(8, 10):
        system.post_csv(f"obs-{n}", csv_for(n))
        system.wait_state(f"shipment-obs-{n}")
    resumed, resumed_out = _observer(system, "--json", "--from", last_id)
    wait_for(lambda: len(_lines(resumed_out)) >= 10, 10, message="resumed observer caught up")
    missed = [json.loads(line) for line in _lines(resumed_out)]
    assert {e["jobId"] for e in missed} == {"shipment-obs-8", "shipment-obs-9"}
    assert len(missed) == 10
    resumed.send_signal(signal.SIGTERM)
    assert resumed.wait(timeout=10) == 0
    # From an event inside an entry: obs-0's 'validated' shares its apply step's
    # entry with 'committed' and 'completed', which come next, then the rest in order.
    inside = next(e for e in events if e["jobId"] == "shipment-obs-0" and e["data"].get("phase") == "validated")
    after_inside = [e["id"] for e in events[events.index(inside) + 1:] + missed]
    assert [e["event"] for e in events[events.index(inside) + 1:][:2]] == ["progress", "completed"]
    again, again_out = _observer(system, "--json", "--from", inside["id"])
    wait_for(lambda: len(_lines(again_out)) >= len(after_inside), 10, message="observer from inside an entry caught up")
    assert [json.loads(line)["id"] for line in _lines(again_out)] == after_inside
    again.send_signal(signal.SIGTERM)
    assert again.wait(timeout=10) == 0
    plain.send_signal(signal.SIGTERM)
    assert plain.wait(timeout=10) == 0


def test_the_observer_survives_a_redis_restart(tmp_path: Path, make_system: object) -> None:
    port = free_port()
    server = EmbeddedRedis(tmp_path / "restartable", port=port)
    url = server.start()
    try:
        system = make_system(IMPORTER_REDIS_URL=url)  # type: ignore[operator]
        observer, out = _observer(system, "--json")
        client = redis.Redis.from_url(url)
        events = system.store().keys.events
        client.xadd(events, {"event": "waiting", "jobId": "before-restart", "batchId": "b", "attempt": 0, "data": "{}"})
        wait_for(lambda: "before-restart" in out.read_text(), 10, message="first event")
        server.stop()
        time.sleep(1.5)
        server.start()  # same port, same data directory (AOF)
        client = redis.Redis.from_url(url)
        client.xadd(events, {"event": "waiting", "jobId": "after-restart", "batchId": "b", "attempt": 0, "data": "{}"})
        wait_for(lambda: "after-restart" in out.read_text(), 30, message="event after the restart")
        assert [json.loads(line)["jobId"] for line in _lines(out)] == ["before-restart", "after-restart"]
        observer.send_signal(signal.SIGINT)
        assert observer.wait(timeout=10) == 0
    finally:
        server.stop()


@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_lets_the_worker_finish_an_import_in_flight(make_system: object, signals: int) -> None:
    system = make_system()  # type: ignore[operator]
    system.start_http()
    worker = system.start_worker(IMPORTER_FAULT="before_apply:3", IMPORTER_LOG_LEVEL="debug")  # import.applied: a debug line
    system.post_csv("graceful-1", SEED)
    wait_for(lambda: "fault.injected" in worker.log(), 10, message="import in flight")
    for _ in range(signals):
        worker.popen.send_signal(signal.SIGTERM)
        time.sleep(0.2)
    assert worker.popen.wait(timeout=30) == 0
    record = system.get_job("shipment-graceful-1")[1]
    assert record["state"] == "completed" and record["attempt"] == 1
    store = system.store()
    assert store.stock_of(["WIDGET-RED-01"]) == {"WIDGET-RED-01": 10}
    assert store.generation() == 1
    log = worker.log()
    assert log.index('"import.applied"') < log.index('"worker.redis_closed"')
    levels = [json.loads(line).get("level") for line in log.splitlines() if line.startswith("{")]
    assert "error" not in levels and "critical" not in levels, log
    assert "Traceback" not in log
    if signals == 2:
        assert "worker.already_stopping" in log


@pytest.mark.parametrize("server", ["granian", "gunicorn"])
@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_drains_the_http_server_without_losing_an_accepted_job(make_system: object, signals: int, server: str) -> None:
    system = make_system(IMPORTER_HTTP_DRAIN_DELAY="1.5")  # type: ignore[operator]
    http = system.start_http(server=server)
    accepted: list[str] = []
    health: list[tuple[int, str]] = []
    stop = threading.Event()

    def burst(worker: int) -> None:
        n = 0
        while not stop.is_set():
            batch = f"burst-{worker}-{n}"
            n += 1
            try:
                status, _ = system.post_csv(batch, csv_for(n))
            except OSError:
                continue
            if status == 202:
                accepted.append(batch)

    def watch_health() -> None:
        while not stop.is_set():
            try:
                status, _, body = system.request("GET", "/health", key=None)
                health.append((status, json.loads(body).get("reason", "")))
            except OSError:
                pass
            time.sleep(0.05)

    threads = [threading.Thread(target=burst, args=(i,)) for i in range(3)] + [threading.Thread(target=watch_health)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    for _ in range(signals):
        http.popen.send_signal(signal.SIGTERM)
        time.sleep(0.1)
    rc = http.popen.wait(timeout=30)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert rc == 0
    assert len(accepted) > 10
    store = system.store()
    missing = [b for b in accepted if store.get_job(job_id_for(b)) is None]
    assert missing == []
    assert (503, "closing") in health
    assert "http.closed" in http.log()


def test_two_sigterms_to_the_observer_exit_once_with_0(make_system: object) -> None:
    system = make_system()  # type: ignore[operator]
    observer, _ = _observer(system)
    for _ in range(3):  # spaced: identical pending signals would coalesce into one
        observer.send_signal(signal.SIGTERM)
        time.sleep(0.05)
    assert observer.wait(timeout=10) == 0
    assert system.procs[-1].log().count(" events.closed") == 1  # text lines: no --json
    assert "events.already_stopping" in system.procs[-1].log()


def test_a_retry_after_a_killed_worker_reports_attempt_2(make_system: object) -> None:
    system = make_system()  # type: ignore[operator]
    observer, out = _observer(system, "--json")
    system.start_http()
    doomed = system.start_worker(IMPORTER_FAULT="before_apply:60")
    system.post_csv("retry-2", SEED)
    wait_for(lambda: "fault.injected" in doomed.log(), 10, message="first attempt in flight")
    doomed.kill()
    system.start_worker()
    record = system.wait_state("shipment-retry-2")
    assert (record["state"], record["attempt"]) == ("completed", 2)
    wait_for(lambda: "completed" in out.read_text(), 10, message="completion event")
    mine = [json.loads(line) for line in _lines(out) if "shipment-retry-2" in line]
    # The killed attempt's lease runs out: the reconciler takes the job back
    # (retrying, import.worker_lost) and sends it again.
    assert [(e["event"], e["attempt"]) for e in mine] == [
        ("waiting", 0), ("active", 1), ("retrying", 1), ("active", 2), ("progress", 2), ("progress", 2), ("completed", 2),
    ]
    assert system.store().generation() == 1


def test_the_readable_observer_writes_its_own_lines_as_text(make_system: object) -> None:
    """`importer events` without --json mixed JSON log lines into its readable output."""
    import re

    system = make_system()  # type: ignore[operator]
    env = {k: v for k, v in system.env.items() if k != "IMPORTER_LOG_FORMAT"}
    done = subprocess.Popen(
        [sys.executable, "-m", "importer.adapters.processes.cli", "events"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    time.sleep(2)
    done.send_signal(signal.SIGTERM)
    shown = done.communicate(timeout=20)[0].decode()
    lines = shown.splitlines()
    assert lines and all(re.match(r"^\d\d:\d\d:\d\d (info |warning) events\.", line) for line in lines), shown
