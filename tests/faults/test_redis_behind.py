"""Redis coming back behind the ledger, with real servers and processes: a
redis-server of the test's own (RDB snapshots), the session's PostgreSQL,
`importer serve`, a worker and `importer ledger`.

* restored from an older snapshot: SAVE after shipments A, shipments B
  applied and exported, everything stopped, the older dump.rdb put back;
* emptied: a Redis with no data in front of the ledger that holds A and B.

Each time: the location is caught as behind before it takes a shipment (a
POST answers 503 store.behind_ledger, /health and `importer doctor` say so),
`importer ledger restore` (or the exporter by itself) brings it forward; then
stock per SKU is the sum of the ledger's distinct shipments, every re-POST of
an old batch is a replay (other content: 409), receipts read the same bytes,
`importer ledger verify` is clean, and no POST got a 500."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from importer.domain.shipment import job_id_for
from tests.faults.harness import FAULT_ENV, RedisServer
from tests.integration.support import ROOT, System, free_port, wait_for

pytestmark = pytest.mark.faults

SKUS = [f"RB-{i}" for i in range(8)]


def shipment(i: int) -> bytes:
    return f"sku,quantity\n{SKUS[i % 8]},{i % 5 + 1}\n{SKUS[(i + 3) % 8]},2\n".encode()


def send(system: System, batches: range, statuses: Counter[int]) -> None:
    """POST each, as a client would: again after a 503 store.behind_ledger (each process drops
    a location's mark from its view within a second of the restore)."""
    for i in batches:
        deadline = time.monotonic() + 10
        while True:
            status, body = system.post_csv(f"rb-{i}", shipment(i))
            statuses[status] += 1
            if status != 503 or body.get("code") != "store.behind_ledger" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert status == 202, body
    for i in batches:
        assert system.wait_state(job_id_for(f"rb-{i}"), timeout=60)["state"] == "completed"


def exported(db: str, count: int) -> None:
    def done() -> bool:
        with psycopg.connect(db) as conn:
            row = conn.execute("SELECT count(*) FROM ledger_shipments WHERE location = 'main'").fetchone()
        return bool(row and row[0] == count)
    wait_for(done, 60, 0.1, message=f"{count} shipments in the ledger")


def ledger_stock(db: str) -> dict[str, int]:
    with psycopg.connect(db) as conn:
        rows = conn.execute("SELECT sku, sum(quantity) FROM ledger_movements WHERE location = 'main' GROUP BY sku").fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


def cli(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "importer.adapters.processes.cli", *args], env=system.env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def redis_stock(system: System) -> dict[str, int]:
    store = system.store()
    return {sku: units for sku, units in store.stock_all("main").items() if sku in SKUS}


def ledger_system(url: str, tmp_path: Path, db: str, **env: str) -> System:
    return System(url, tmp_path, env_overrides={
        **FAULT_ENV, "IMPORTER_DATABASE_URL": db, "IMPORTER_LEDGER_INTERVAL": "0.05", **env})


def start_all(system: System) -> None:
    system.start_worker()
    system.start_http()
    system.start_ledger()


def put_back(system: System, server: RedisServer, backup: Path | None) -> None:
    """Every process stopped, the server SIGKILLed, ``backup`` put back as its dump.rdb
    (None: nothing, an empty Redis), the server started again."""
    system.stop_all()
    system.procs.clear()
    server.kill()
    (server.dir / "dump.rdb").unlink(missing_ok=True)
    if backup is not None:
        shutil.copy(backup, server.dir / "dump.rdb")
    server.start()


def snapshot_with_waiting(system: System, server: RedisServer, tmp_path: Path, waiting: range) -> Path:
    """With no worker, ``waiting`` POSTed; SAVE (they wait in the snapshot: a copy of its
    dump.rdb is returned); a worker started again applies them (the ledger will hold them)."""
    system.procs[0].terminate()  # the worker (started first)
    system.procs[0].wait_stopped()
    for i in waiting:
        assert system.post_csv(f"rb-{i}", shipment(i))[0] == 202
    server.client().save()
    backup = tmp_path / "dump-with-waiting.rdb"
    shutil.copy(server.dir / "dump.rdb", backup)
    system.start_worker()
    for i in waiting:
        assert system.wait_state(job_id_for(f"rb-{i}"), timeout=60)["state"] == "completed"
    return backup


@pytest.mark.parametrize(("how", "kill_at"), [
    ("older_snapshot", ""), ("emptied", ""),
    ("older_snapshot", "restore_markers"), ("older_snapshot", "restore_stock"), ("emptied", "restore_clear"),
], ids=["older_snapshot", "emptied", "killed_after_markers", "killed_after_stock", "killed_before_clear"])
def test_redis_back_behind_the_ledger_is_caught_then_brought_forward(
    tmp_path: Path, make_database: Any, how: str, kill_at: str,
) -> None:
    server = RedisServer(tmp_path / "redis", rdb=True)
    server.start()
    db = make_database()
    system = ledger_system(server.url, tmp_path, db, IMPORTER_LEDGER_AUTO_RESTORE="0")
    statuses: Counter[int] = Counter()
    try:
        start_all(system)
        send(system, range(0, 37), statuses)  # A
        # ...and 3 of them waiting when the snapshot is taken: the ledger will hold them
        # applied, the snapshot waiting; they must end as replays, never apply twice
        backup = snapshot_with_waiting(system, server, tmp_path, range(37, 40))
        send(system, range(40, 80), statuses)  # B
        exported(db, 80)
        receipt_b = system.request("GET", "/api/shipments/rb-45/receipt")[2]
        assert redis_stock(system) == ledger_stock(db)

        put_back(system, server, backup if how == "older_snapshot" else None)
        behind_stock = redis_stock(system)
        assert behind_stock != ledger_stock(db)

        # Caught before it takes a shipment: the HTTP process and the worker, with no exporter.
        system.start_worker()
        system.start_http()
        wait_for(lambda: json.loads(system.request("GET", "/health", key=None)[2]).get("reason") == "store_behind_ledger",
                 30, 0.1, message="/health says behind")
        health = json.loads(system.request("GET", "/health", key=None)[2])
        assert health["ledger"]["behind"][0]["location"] == "main", health
        lacking = 43 if how == "older_snapshot" else 80  # B, and the 3 waiting in the snapshot
        assert health["ledger"]["behind"][0]["shipments"] == lacking, health
        for i in (41, 100):  # an old batch of B, and a new one: nothing taken
            status, _, raw = system.request("POST", f"/api/imports?batchId=rb-{i}", body=shipment(i), ctype="text/csv")
            statuses[status] += 1
            assert status == 503 and json.loads(raw)["code"] == "store.behind_ledger", raw
            assert system.request("GET", f"/api/imports/{job_id_for(f'rb-{i}')}")[0] == 404 or i == 41
        assert redis_stock(system) == behind_stock
        doctor = cli(system, "doctor")
        assert "redis at main" in doctor.stdout and "behind the ledger by" in doctor.stdout, doctor.stdout
        dry = cli(system, "ledger", "restore", "--dry-run")
        assert dry.returncode == 0 and "dry run: main: the ledger holds 80 shipment(s)" in dry.stdout, dry.stdout + dry.stderr
        assert redis_stock(system) == behind_stock  # a dry run writes nothing

        if kill_at:  # SIGKILLed at that point: still marked, nothing taken; run again
            log_path = tmp_path / "restore.log"
            with open(log_path, "wb") as out:
                killed = subprocess.Popen([sys.executable, "-m", "importer.adapters.processes.cli", "ledger", "restore"],
                                          env={**system.env, "IMPORTER_FAULT": f"{kill_at}:60"}, cwd=ROOT,
                                          stdout=out, stderr=subprocess.STDOUT)
            wait_for(lambda: b"fault.injected" in log_path.read_bytes(), 60, 0.1, message=f"restore at {kill_at}")
            killed.send_signal(signal.SIGKILL)
            killed.wait(10)
            status, _, raw = system.request("POST", "/api/imports?batchId=rb-101", body=shipment(101), ctype="text/csv")
            statuses[status] += 1
            assert status == 503 and json.loads(raw)["code"] == "store.behind_ledger", raw
            system.store().client.delete(system.store().partition("main").ledger_restoring)  # its lock would expire in 60 s
        restored = cli(system, "ledger", "restore")
        assert restored.returncode == 0, restored.stdout + restored.stderr
        if not kill_at:
            assert f"wrote {lacking} done marker(s)" in restored.stdout, restored.stdout
        assert redis_stock(system) == ledger_stock(db)
        assert cli(system, "ledger", "restore").stdout.startswith("ledger restore: no location is behind")  # idempotent
        wait_for(lambda: json.loads(system.request("GET", "/health", key=None)[2])["status"] == "ok", 30, 0.1)

        if how == "older_snapshot":  # waiting in the snapshot, applied in the ledger: replays, never twice
            for i in range(37, 40):
                record = system.wait_state(job_id_for(f"rb-{i}"), timeout=60)
                assert record["state"] == "completed" and record["result"].get("replay") is True, record
        # Every old batch is a replay, other content a conflict; receipts read the same bytes.
        for i in range(1, 80, 4):
            status, body = system.post_csv(f"rb-{i}", shipment(i))
            statuses[status] += 1
            assert status == 202, body
            record = system.wait_state(job_id_for(f"rb-{i}"), timeout=60)
            # A's jobs are in the older snapshot: the same job again; every other one replays
            kept = how == "older_snapshot" and i < 37
            assert record["state"] == "completed" and record["result"].get("replay") is (None if kept else True), record
        status, body = system.post_csv("rb-50", b"sku,quantity\nRB-0,999\n")
        statuses[status] += 1
        assert status == 409 and body["code"] == "batch.conflict", body
        assert system.request("GET", "/api/shipments/rb-45/receipt")[2] == receipt_b
        send(system, range(100, 110), statuses)  # new shipments apply on the restored stock
        system.start_ledger()
        exported(db, 90)
        assert redis_stock(system) == ledger_stock(db)
        verified = cli(system, "ledger", "verify")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        with psycopg.connect(db) as conn:
            row = conn.execute("SELECT count(*), count(DISTINCT batch_id) FROM ledger_shipments").fetchone()
        assert row == (90, 90)
        assert statuses[500] == 0, statuses
        print(f"[faults] redis {how}: behind by {health['ledger']['behind'][0]['shipments']} shipments, restored; "
              f"statuses {dict(statuses)}")
    finally:
        system.stop_all()
        server.stop()



def recover_under_load(system: System, db: str, statuses: Counter[int], *, old: range) -> int:
    """Start every process on the Redis that came back behind, a producer POSTing new
    shipments and re-POSTing ``old`` ones (applied after the older state, held by the
    ledger) from then on, through the exporter's restore. Then: every POST answered
    202 or 503 (never 500), every accepted one ended once, each old one a replay, stock
    the ledger's, verify clean, one ledger.redis_behind line. Returns the new ones."""
    accepted: list[int] = []
    replayed: list[int] = []
    stop = threading.Event()

    def produce() -> None:
        i = 1000
        while not stop.is_set():
            again = old[len(replayed)] if len(replayed) < len(old) and i % 2 else None
            n = again if again is not None else i
            try:
                status, _, _ = system.request("POST", f"/api/imports?batchId=rb-{n}", body=shipment(n), ctype="text/csv")
            except OSError:
                status = 0  # no HTTP process listening yet
            statuses[status] += 1
            if status == 202:
                (replayed if again is not None else accepted).append(n)
            if again is None and status == 202 or again is not None and status != 202:
                i += 1
            time.sleep(0.05)

    system.start_worker()
    system.start_http()
    producer = threading.Thread(target=produce, daemon=True)  # through the restore
    producer.start()
    try:
        time.sleep(1)
        exporter = system.start_ledger()
        wait_for(lambda: "ledger.restored" in exporter.log(), 60, 0.2, message="brought forward by the exporter")
        # one line, by whichever process marked it first (the worker checks before it consumes)
        assert sum('"event": "ledger.redis_behind"' in line for p in system.procs for line in p.log().splitlines()) == 1
        wait_for(lambda: len(replayed) == len(old), 60, 0.2, message="every old batch sent again")
        time.sleep(1)
    finally:
        stop.set()
        producer.join(30)
    for i in accepted:
        assert system.wait_state(job_id_for(f"rb-{i}"), timeout=60)["state"] == "completed", i
    for i in replayed:
        record = system.wait_state(job_id_for(f"rb-{i}"), timeout=60)
        assert record["state"] == "completed" and record["result"].get("replay") is True, record
    exported(db, old.stop + len(set(accepted)))
    assert redis_stock(system) == ledger_stock(db)
    verified = cli(system, "ledger", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert statuses[500] == 0 and set(statuses) <= {0, 202, 503}, statuses
    return len(accepted)


def test_an_older_snapshot_restored_under_load_is_brought_forward_by_the_exporter(tmp_path: Path, make_database: Any) -> None:
    """SAVE after A, B applied and exported, everything stopped, the older dump.rdb put
    back; every process started again with a producer POSTing new shipments and B's
    batches again throughout, the exporter bringing Redis forward by itself."""
    server = RedisServer(tmp_path / "redis", rdb=True)
    server.start()
    db = make_database()
    system = ledger_system(server.url, tmp_path, db)
    statuses: Counter[int] = Counter()
    try:
        start_all(system)
        send(system, range(0, 30), statuses)  # A
        exported(db, 30)
        server.client().save()
        backup = tmp_path / "dump-after-a.rdb"
        shutil.copy(server.dir / "dump.rdb", backup)
        send(system, range(30, 60), statuses)  # B
        exported(db, 60)
        put_back(system, server, backup)
        new = recover_under_load(system, db, statuses, old=range(30, 60))
        print(f"[faults] older snapshot under load: {new} new shipments meanwhile, statuses {dict(statuses)}")
    finally:
        system.stop_all()
        server.stop()


def test_a_replica_promoted_without_the_last_applies_is_brought_forward_under_load(tmp_path: Path, make_database: Any) -> None:
    """Replication cut (the replica pointed at a dead master) while shipments B are applied and
    exported (their records reached the replica, waiting); the master SIGKILLed; the replica
    promoted (REPLICAOF NO ONE) and every process started on it, with a producer POSTing new
    shipments and B's batches from then on, through the exporter's restore."""
    master = RedisServer(tmp_path / "master", rdb=True)
    master.start()
    replica = RedisServer(tmp_path / "replica", rdb=True)
    replica.extra = ["--replicaof", "127.0.0.1", str(master.port)]
    replica.start()
    db = make_database()
    system = ledger_system(master.url, tmp_path, db)
    statuses: Counter[int] = Counter()
    try:
        start_all(system)
        send(system, range(0, 30), statuses)  # A
        exported(db, 30)
        # B: recorded on both (a POST waits for the replica), then applied on the master
        # only, with replication cut, and exported: the ledger holds what the replica lacks
        system.procs[0].terminate()
        system.procs[0].wait_stopped()
        for i in range(30, 60):
            status, body = system.post_csv(f"rb-{i}", shipment(i))
            assert status == 202, body
        assert master.client().execute_command("WAIT", 1, 5000) == 1
        # Cut off (a SIGSTOP is not enough: what the master already sent waits in the stopped
        # replica's socket buffer, and it reads it once continued, the master dead or not).
        replica.client().execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
        system.start_worker()
        for i in range(30, 60):
            assert system.wait_state(job_id_for(f"rb-{i}"), timeout=60)["state"] == "completed"
        exported(db, 60)
        system.stop_all()
        system.procs.clear()
        master.kill()
        replica.client().execute_command("REPLICAOF", "NO", "ONE")
        system.redis_url = replica.url
        new = recover_under_load(system, db, statuses, old=range(30, 60))
        print(f"[faults] replica promoted behind: {new} new shipments meanwhile, statuses {dict(statuses)}")
    finally:
        system.stop_all()
        replica.stop()
        master.stop()



@pytest.mark.parametrize("applied_after", [5, 0], ids=["some_not_waiting", "all_waiting"])
def test_second_applications_that_slipped_in_before_the_check(tmp_path: Path, make_database: Any, applied_after: int) -> None:
    """The window start.lua's gate leaves (a snapshot restored within its last renewal's
    2 s), forced: a worker with no ledger configured (so no gate, no check) applies again
    the 3 jobs that were waiting in the snapshot, which the ledger holds applied.

    * some_not_waiting: 5 more shipments were applied after the snapshot and were not
      waiting in it. Redis then counted fewer applies than the ledger holds: found behind
      (though it has the ledger's last batch's marker), and the restore undoes the 3 second
      applications (stock as the ledger's movements end, their journal entries dropped).
    * all_waiting: every shipment after the snapshot was waiting in it: applied again on
      the same stock, Redis is not behind; the exporter meets the 3 entries as second
      applications, logs each at error, and exports none twice.

    Either way: stock is the ledger's, nothing is in the ledger twice, verify is clean."""
    server = RedisServer(tmp_path / "redis", rdb=True)
    server.start()
    db = make_database()
    system = ledger_system(server.url, tmp_path, db)
    statuses: Counter[int] = Counter()
    total = 33 + applied_after
    try:
        start_all(system)
        send(system, range(0, 30), statuses)
        backup = snapshot_with_waiting(system, server, tmp_path, range(30, 33))
        send(system, range(33, 33 + applied_after), statuses)
        exported(db, total)
        put_back(system, server, backup)

        system.start_worker(IMPORTER_DATABASE_URL="")  # no ledger: no gate, no check
        system.start_http(IMPORTER_DATABASE_URL="")
        for i in range(30, 33):
            record = system.wait_state(job_id_for(f"rb-{i}"), timeout=60)
            assert record["state"] == "completed" and record["result"].get("replay") is None, record  # applied again
        system.stop_all()
        system.procs.clear()

        system.start_worker()
        system.start_http()
        exporter = system.start_ledger()
        if applied_after:
            wait_for(lambda: "ledger.restored" in exporter.log(), 60, 0.2, message="brought forward by the exporter")
            restored = next(json.loads(line) for line in exporter.log().splitlines() if '"ledger.restored"' in line)
            assert "3 second application(s) undone" in restored["detail"], restored
            assert "ledger.second_application" not in exporter.log()  # undone before the exporter met them
        else:
            wait_for(lambda: exporter.log().count('"event": "ledger.second_application"') == 3, 60, 0.2,
                     message="the exporter's alarm for each")
            assert "ledger.redis_behind" not in "".join(p.log() for p in system.procs)
        assert redis_stock(system) == ledger_stock(db)
        send(system, range(50, 53), statuses)
        exported(db, total + 3)
        assert redis_stock(system) == ledger_stock(db)
        with psycopg.connect(db) as conn:
            assert conn.execute("SELECT count(*), count(DISTINCT batch_id) FROM ledger_shipments").fetchone() == (total + 3,) * 2
        verified = cli(system, "ledger", "verify")
        assert verified.returncode == 0, verified.stdout + verified.stderr
    finally:
        system.stop_all()
        server.stop()


def test_an_emptied_redis_gets_back_the_ledgers_locations_too(tmp_path: Path, make_database: Any) -> None:
    """An emptied Redis lost the registry of declared locations with the rest. Started with
    no location declared (IMPORTER_LOCATIONS empty), the exporter still finds paris behind
    (the ledger knows it), brings it forward and declares it again: a re-POST there replays."""
    server = RedisServer(tmp_path / "redis", rdb=True)
    server.start()
    db = make_database()
    system = ledger_system(server.url, tmp_path, db)
    try:
        start_all(system)
        status, _, raw = system.request("POST", "/api/imports?batchId=rb-p&location=paris", body=shipment(1), ctype="text/csv")
        assert status == 202, raw
        assert system.wait_state(job_id_for("rb-p", "paris"), timeout=60)["state"] == "completed"
        exported(db, 0)  # main: none
        def held() -> bool:
            with psycopg.connect(db) as conn:
                return conn.execute("SELECT count(*) FROM ledger_shipments WHERE location = 'paris'").fetchone() == (1,)
        wait_for(held, 60, 0.1, message="exported")
        put_back(system, server, None)
        nowhere = {"IMPORTER_LOCATIONS": ""}
        system.start_worker(**nowhere)
        system.start_http(**nowhere)
        exporter = system.start_ledger(**nowhere)
        wait_for(lambda: "ledger.restored" in exporter.log(), 60, 0.2, message="paris brought forward")
        assert "paris" in system.store().locations()

        def replayed() -> bool:
            status, _, raw = system.request("POST", "/api/imports?batchId=rb-p&location=paris", body=shipment(1),
                                            ctype="text/csv")
            assert status in (202, 503), raw
            return status == 202
        wait_for(replayed, 10, 0.2, message="taken at paris")
        assert system.wait_state(job_id_for("rb-p", "paris"), timeout=60)["result"].get("replay") is True
        assert system.store().stock_of([SKUS[1], SKUS[4]], "paris") == {SKUS[1]: 2, SKUS[4]: 2}
    finally:
        system.stop_all()
        server.stop()
