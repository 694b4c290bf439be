"""The ledger through the real processes: `importer serve`, `importer worker`
and `importer ledger` on Redis, with a real PostgreSQL (the embedded one, or
IMPORTER_TEST_DATABASE_URL). Every applied shipment reaches the ledger once,
with movements equal to its receipt; Redis drops what the ledger holds; a
batch whose done marker left Redis is never applied again."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from importer.domain.shipment import job_id_for
from tests.integration.support import ROOT, System, wait_for

pytestmark = pytest.mark.integration


def shipment(rows: dict[str, int]) -> bytes:
    return ("sku,quantity\n" + "".join(f"{sku},{q}\n" for sku, q in rows.items())).encode()


def import_and_wait(system: System, batch_id: str, data: bytes, location: str = "main") -> dict:
    suffix = f"&location={location}" if location != "main" else ""
    status, _, body = system.request("POST", f"/api/imports?batchId={batch_id}{suffix}", body=data, ctype="text/csv")
    assert status == 202, body
    return system.wait_state(job_id_for(batch_id, location), timeout=60)


def ledger_rows(url: str) -> tuple[dict[tuple[str, str], tuple[Any, ...]], dict[tuple[str, str], list[tuple[Any, ...]]]]:
    with psycopg.connect(url) as conn:
        shipments = {
            (r[0], r[1]): r[2:]
            for r in conn.execute(
                "SELECT location, batch_id, owner, job_id, row_count, result, receipt FROM ledger_shipments"
            ).fetchall()
        }
        moves: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
        for r in conn.execute(
            "SELECT location, batch_id, line, sku, before, quantity, after FROM ledger_movements ORDER BY location, batch_id, line"
        ).fetchall():
            moves.setdefault((r[0], r[1]), []).append(r[2:])
    return shipments, moves


def stored_receipt_lines(system: System, batch_id: str, location: str = "main") -> list[tuple[int, str, int, int, int]]:
    store = system.store()
    raw = store.client.get(store.partition(location).receipt(batch_id))
    assert raw is not None
    lines = []
    for n, line in enumerate(raw.decode().splitlines(), start=1):
        sku, before, quantity = line.split(",")
        lines.append((n, sku, int(before), int(quantity), int(before) + int(quantity)))
    return lines


def test_every_applied_shipment_reaches_the_ledger_once_with_its_receipt_as_movements(make_system: Any, make_database: Any) -> None:
    db = make_database()
    system = make_system(IMPORTER_DATABASE_URL=db)
    system.start_worker()
    system.start_http()
    batches = {
        ("main", "ledger-a"): {"SKU-A": 3, "SKU-B": 4},
        ("main", "ledger-b"): {"SKU-A": 5},
        ("paris", "ledger-a"): {"SKU-A": 7, "SKU-C": 1},
    }
    for (location, batch_id), rows in batches.items():
        assert import_and_wait(system, batch_id, shipment(rows), location)["state"] == "completed"
    receipts = {key: stored_receipt_lines(system, key[1], key[0]) for key in batches}
    # an invalid file and a replay do not reach the ledger as shipments
    import_and_wait(system, "ledger-a", shipment(batches[("main", "ledger-a")]))  # the live job: same job, no new apply

    system.start_ledger()
    shipments, moves = wait_for(
        lambda: (r := ledger_rows(db)) and len(r[0]) == 3 and r, 30, 0.1, message="3 shipments in the ledger"
    )
    assert set(shipments) == set(batches)
    for key, rows in batches.items():
        owner, job_id, row_count, result, state = shipments[key]
        assert (owner, job_id, row_count, state) == ("owner-a", job_id_for(key[1], key[0]), len(rows), "whole")
        assert result == '{"imported":%d,"batchId":"%s"}' % (len(rows), key[1])
        assert moves[key] == receipts[key]
    # stock = the sum of the distinct applied batches, per location
    store = system.store()
    assert store.stock_of(["SKU-A"])["SKU-A"] == 8
    assert store.stock_of(["SKU-A"], "paris")["SKU-A"] == 7
    # a second exporter finds nothing left to do: nothing twice
    system.start_ledger(once=True).popen.wait(60)
    assert ledger_rows(db)[0] == shipments
    verified = run_cli(system, "ledger", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_redis_drops_what_the_ledger_holds_and_an_archived_batch_is_never_applied_again(make_system: Any, make_database: Any) -> None:
    """Hot window 0 and a horizon of 1 s: once exported, the receipt and the
    journal entry leave Redis, and the done marker too once its job record is
    gone. The same batch posted again is a replay (stock unchanged); other
    content under its batchId fails batch.conflict."""
    db = make_database()
    system = make_system(
        IMPORTER_DATABASE_URL=db, IMPORTER_LEDGER_HOT_WINDOW="0", IMPORTER_IDEMPOTENCY_HORIZON="1",
        IMPORTER_LEDGER_INTERVAL="0.05",
    )
    system.start_worker()
    system.start_http()
    data = shipment({"ARCH-1": 10, "ARCH-2": 2})
    import_and_wait(system, "archived-1", data)
    import_and_wait(system, "archived-2", shipment({"ARCH-1": 1}))
    store = system.store()
    k = store.partition("main")
    reads = ["/api/shipments/archived-1", "/api/shipments/archived-1/receipt"]
    answers = {path: system.request("GET", path) for path in reads}
    answers_csv = {path: system.request("GET", path, headers={"Accept": "text/csv"}) for path in reads}
    assert all(status == 200 for status, _, _ in answers.values())

    def same_answers(moment: str) -> None:
        for path in reads:
            assert system.request("GET", path)[2] == answers[path][2], (moment, path)
            assert system.request("GET", path, headers={"Accept": "text/csv"})[2] == answers_csv[path][2], (moment, path)
        assert system.request("GET", "/api/shipments/archived-1", key=system.other_key)[0] == 404

    system.start_ledger()
    wait_for(lambda: store.client.xlen(k.journal) == 0, 30, 0.05, message="journal trimmed")
    assert store.client.exists(k.receipt("archived-1"), k.receipt("archived-2")) == 0
    assert len(ledger_rows(db)[0]) == 2
    same_answers("receipt only in the ledger")
    # the marker stays while its job record exists
    time.sleep(1.5)
    assert store.client.exists(k.done("archived-1")) == 1
    store.delete_job_record(job_id_for("archived-1"))
    wait_for(lambda: store.client.exists(k.done("archived-1")) == 0, 30, 0.05, message="marker pruned")
    assert store.client.exists(k.done("archived-2")) == 1  # its record is still there
    assert int(store.client.get(k.ledger_pruned)) >= 1
    same_answers("marker and receipt only in the ledger")

    before = store.stock_of(["ARCH-1", "ARCH-2"])
    again = import_and_wait(system, "archived-1", data)
    assert again["state"] == "completed"
    assert again["result"] == {"imported": 2, "batchId": "archived-1", "replay": True}
    assert store.stock_of(["ARCH-1", "ARCH-2"]) == before
    assert store.client.exists(k.done("archived-1")) == 0  # an archived batch is not brought back

    store.delete_job_record(job_id_for("archived-1"))
    status, problem = system.post_csv("archived-1", shipment({"ARCH-1": 99}))  # other content: 409 at once
    assert status == 409 and problem["code"] == "batch.conflict", problem
    status, problem = system.post_csv("archived-1", data, key=system.other_key)  # another producer's batchId
    assert status == 409 and problem["code"] == "batch.conflict", problem
    assert system.get_job(job_id_for("archived-1"))[0] == 404  # nothing recorded
    assert store.stock_of(["ARCH-1", "ARCH-2"]) == before
    assert len(ledger_rows(db)[0]) == 2

    # The bulk intake asks the ledger as a single POST does (its script call
    # reads once whether any batchId was pruned here): the archived batch with
    # other content is refused, with its own content it is a replay, and a new
    # batch in the same request applies.
    lines = [("archived-1", shipment({"ARCH-1": 99})), ("archived-1", data), ("archived-3", shipment({"ARCH-2": 5}))]
    ndjson = b"".join(json.dumps({"batchId": b, "csv": csv.decode()}).encode() + b"\n" for b, csv in lines)
    status, _, body = system.request("POST", "/api/imports/bulk", body=ndjson, ctype="application/x-ndjson")
    assert status == 200, body
    got = [(r["status"], r["body"].get("code") or r["body"]["jobId"]) for r in json.loads(body)["results"]]
    assert got == [(409, "batch.conflict"), (202, "shipment-archived-1"), (202, "shipment-archived-3")]
    replayed = system.wait_state("shipment-archived-1", ("completed",))
    assert replayed["result"] == {"imported": 2, "batchId": "archived-1", "replay": True}
    assert system.wait_state("shipment-archived-3", ("completed",))["result"]["imported"] == 1
    assert store.stock_of(["ARCH-1", "ARCH-2"]) == {"ARCH-1": before["ARCH-1"], "ARCH-2": before["ARCH-2"] + 5}


class HeldLedger:
    """The worker's ledger lookups, held at the point between the ledger's
    answer and the apply that uses it: ``meanwhile`` (the other side) runs
    there on the first call, then the real ledger answers as of before it."""

    def __init__(self, ledger: Any, meanwhile: Any) -> None:
        self.ledger = ledger
        self.meanwhile = meanwhile
        self.calls: list[list[str]] = []

    def archived(self, location: str, batch_ids: list[str]) -> Any:
        self.calls.append(list(batch_ids))
        answer = self.ledger.archived(location, batch_ids)
        if len(self.calls) == 1:
            self.meanwhile()
        return answer


def test_a_pruning_between_the_ledgers_answer_and_the_apply_makes_the_apply_ask_again(make_system: Any, make_database: Any) -> None:
    """The interleaving forced: a re-post of a batch whose marker was pruned
    asks the ledger; after the ledger answered and before the apply runs, the
    exporter prunes another marker. The apply must not use the older answer:
    it asks again, then replays the batch (stock unchanged). A new batch at
    the same location never asks the ledger at all (the filter of pruned
    batchIds vouches for it)."""
    from importer.adapters.postgres.ledger import PostgresLedger
    from importer.domain.shipment import Shipment, parse_shipment

    db = make_database()
    system = make_system(
        IMPORTER_DATABASE_URL=db, IMPORTER_LEDGER_HOT_WINDOW="0", IMPORTER_IDEMPOTENCY_HORIZON="0",
    )
    system.start_worker()
    system.start_http()
    data = shipment({"HOLD-OLD": 1})
    for batch_id in ("gone-1", "gone-2"):
        import_and_wait(system, batch_id, data)
    store = system.store()
    k = store.partition("main")
    store.delete_job_record(job_id_for("gone-1"))
    system.start_ledger(once=True).popen.wait(60)
    assert store.client.exists(k.done("gone-1")) == 0 and store.client.exists(k.done("gone-2")) == 1
    pruned_before = int(store.client.get(k.ledger_pruned))
    for proc in system.procs:
        if proc.name == "worker":
            proc.stop()  # the test is the worker from here

    def exporter_prunes_another_marker() -> None:
        store.delete_job_record(job_id_for("gone-2"))
        assert store.prune_markers("main", store.server_time_ms(), recheck_ms=1000) == 1

    ledger = PostgresLedger(db).open()
    try:
        store.archive = held = HeldLedger(ledger, exporter_prunes_another_marker)
        for batch_id, rows in (("gone-1", data), ("held-new", shipment({"HOLD-NEW": 5}))):
            status, accepted = system.post_csv(batch_id, rows)
            assert status == 202, accepted
            record = store.get_job(job_id_for(batch_id))
            assert record is not None
            parsed = parse_shipment(rows)
            assert isinstance(parsed, Shipment)
            outcome, applied = store.start_and_apply(
                job_id=job_id_for(batch_id), upload_id=record.upload_id, batch_id=batch_id, shipment=parsed,
            )
            assert outcome.kind == "started" and applied is not None
            if batch_id == "gone-1":
                assert held.calls == [["gone-1"], ["gone-1"]]  # asked, a pruning happened, asked again
                assert applied.kind == "replayed" and applied.result == {"imported": 1, "batchId": "gone-1", "replay": True}
            else:
                assert held.calls == [["gone-1"], ["gone-1"]]  # a new batch: no question to the ledger
                assert applied.kind == "applied"
    finally:
        ledger.close()
    assert int(store.client.get(k.ledger_pruned)) == pruned_before + 1
    assert store.stock_of(["HOLD-OLD", "HOLD-NEW"]) == {"HOLD-OLD": 2, "HOLD-NEW": 5}


def test_ledger_unreachable_an_import_that_only_the_ledger_can_vouch_for_waits_and_others_apply(
    make_system: Any, make_database: Any,
) -> None:
    """PostgreSQL refusing connections (the worker's URL names a closed port):
    the re-post of a batch whose marker was pruned is not applied on a guess:
    its attempt is an outage (not counted) and it waits; new batches, at that
    location and elsewhere, apply as usual. The POSTs answer 202: no POST
    waits for the ledger. Once the ledger answers, the waiting import replays."""
    from tests.integration.support import free_port

    db = make_database()
    system = make_system(
        IMPORTER_DATABASE_URL=db, IMPORTER_LEDGER_HOT_WINDOW="0", IMPORTER_IDEMPOTENCY_HORIZON="0",
    )
    worker = system.start_worker()
    system.start_http()
    old = shipment({"DOWN-1": 1})
    import_and_wait(system, "down-old", old)
    store = system.store()
    k = store.partition("main")
    store.delete_job_record(job_id_for("down-old"))
    system.start_ledger(once=True).popen.wait(60)
    assert store.client.exists(k.done("down-old")) == 0
    worker.stop()
    unreachable = f"postgresql://postgres@127.0.0.1:{free_port()}/none"
    system.start_worker(IMPORTER_DATABASE_URL=unreachable)
    good_http = system.base_url
    system.start_http(IMPORTER_DATABASE_URL=unreachable)
    # a POST that only the ledger can answer for: 503, nothing recorded; a new batch: 202
    status, headers, raw = system.request("POST", "/api/imports?batchId=down-old", body=old, ctype="text/csv")
    assert status == 503 and json.loads(raw)["code"] == "ledger.unavailable" and headers["Retry-After"] == "5", raw
    assert system.get_job(job_id_for("down-old"))[0] == 404
    status, _ = system.post_csv("down-other", shipment({"DOWN-4": 4}))
    assert status == 202
    system.base_url = good_http

    status, _ = system.post_csv("down-old", old)
    assert status == 202
    assert import_and_wait(system, "down-new", shipment({"DOWN-2": 2}))["state"] == "completed"
    assert import_and_wait(system, "elsewhere", shipment({"DOWN-3": 3}), "lyon")["state"] == "completed"
    time.sleep(3)
    status, record = system.get_job(job_id_for("down-old"))
    assert status == 200 and record["state"] in ("waiting", "active", "retrying"), record
    assert store.stock_of(["DOWN-1", "DOWN-2"]) == {"DOWN-1": 1, "DOWN-2": 2}

    system.start_worker()  # one that reaches the ledger
    done = system.wait_state(job_id_for("down-old"), timeout=90)
    assert done["state"] == "completed" and done["result"] == {"imported": 1, "batchId": "down-old", "replay": True}
    assert store.stock_of(["DOWN-1"])["DOWN-1"] == 1


def run_cli(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "importer.adapters.processes.cli", *args], env=system.env, cwd=ROOT,
        capture_output=True, text=True, timeout=120,
    )


def test_ledger_verify_lag_and_doctor(make_system: Any, make_database: Any) -> None:
    """`importer ledger verify` is clean once exported and names the drift an
    operator's hand makes; /metrics and `importer doctor` show the export lag."""
    db = make_database()
    system = make_system(IMPORTER_DATABASE_URL=db, IMPORTER_METRICS_TOKEN="metrics-token", IMPORTER_LEDGER_HOT_WINDOW="0")
    system.start_worker()
    system.start_http()
    for i in range(3):
        import_and_wait(system, f"verify-{i}", shipment({"VER-A": i + 1, f"VER-{i}": 1}))
    import_and_wait(system, "verify-p", shipment({"VER-A": 7}), "paris")

    def metric(name: str, location: str) -> float:
        status, _, body = system.request("GET", "/metrics", key="metrics-token")
        assert status == 200
        for line in body.decode().splitlines():
            if line.startswith(f'{name}{{location="{location}"}}'):
                return float(line.split()[-1])
        raise AssertionError(f"{name} for {location} not in /metrics")

    assert metric("importer_ledger_lag_entries", "main") == 3
    assert metric("importer_ledger_lag_seconds", "main") > 0
    time.sleep(1.1)  # /health's view of the ledger is at most a second old
    status, _, raw = system.request("GET", "/health", key=None)
    health = json.loads(raw)
    assert status == 200 and health["ledger"]["up"] is True and health["ledger"]["lagEntries"] == 4, health
    doctor = run_cli(system, "doctor")
    assert "ledger schema: version" in doctor.stdout or "ledger schema" in doctor.stdout, doctor.stdout
    assert "3 shipment(s) not yet in the ledger" in doctor.stdout, doctor.stdout

    # verify counts the journal entries not exported yet: clean before any export...
    assert run_cli(system, "ledger", "verify").returncode == 0
    # ...while they are younger than its bound: no exporter past it fails, naming the lag
    late = run_cli(system, "ledger", "verify", "--max-lag", "0.5")
    assert late.returncode == 1, late.stdout + late.stderr
    assert "main: 3 applied shipment(s) not in the ledger, the oldest applied" in late.stdout, late.stdout
    assert "paris: 1 applied shipment(s) not in the ledger" in late.stdout and "is `importer ledger` running?" in late.stdout
    system.start_ledger(once=True).popen.wait(60)
    assert metric("importer_ledger_lag_entries", "main") == 0 and metric("importer_ledger_lag_seconds", "paris") == 0
    clean = run_cli(system, "ledger", "verify")
    # every declared location (the test systems declare paris, lyon, ...), main first
    assert clean.returncode == 0 and "clean at main, " in clean.stdout and " paris" in clean.stdout, clean.stdout + clean.stderr

    store = system.store()
    store.client.hincrby(store.partition("paris").stock, "VER-A", 5)  # a hand in Redis
    drift = run_cli(system, "ledger", "verify")
    assert drift.returncode == 1 and "paris: VER-A is 12 in Redis but its movements end at 7" in drift.stdout, drift.stdout
    assert run_cli(system, "ledger", "verify", "--location", "main").returncode == 0


def test_edge_ids_a_deleted_receipt_and_a_100000_row_shipment(make_system: Any, make_database: Any) -> None:
    """Bad input for the exporter: a batchId and SKUs at the edges of their
    patterns (64 characters, '.', '_', '-'); a receipt an operator deleted
    before the export (the shipment is exported without lines, and the
    exporter says so); a 100,000-row shipment, exported by `importer ledger
    --once` whose peak memory stays bounded (the receipt is read in 1 MiB
    pieces and copied line by line)."""
    db = make_database()
    system = make_system(IMPORTER_DATABASE_URL=db, IMPORTER_ONE_STEP_MAX_BYTES="0")
    system.start_worker()
    system.start_http()
    edge_batch = "9" + "a._-Z" * 12 + "zzz"
    edge_sku = "Z" + "-._9" * 15 + "xyz"
    assert len(edge_batch) == 64 and len(edge_sku) == 64
    import_and_wait(system, edge_batch, shipment({edge_sku: 7, "0": 1}))
    import_and_wait(system, "receipt-gone", shipment({"GONE-1": 2}))
    large = ("sku,quantity\n" + "".join(f"LARGE-{i:07d},{i % 9 + 1}\n" for i in range(100_000))).encode()
    status, _, body = system.request("POST", "/api/imports?batchId=large-100k", body=large, ctype="text/csv")
    assert status == 202, body
    assert system.wait_state(job_id_for("large-100k"), timeout=120)["state"] == "completed"
    store = system.store()
    store.client.delete(store.partition("main").receipt("receipt-gone"))  # an operator's hand

    exporter = system.start_ledger(once=True)
    peak_kib = 0
    while exporter.popen.poll() is None:
        try:
            status_text = Path(f"/proc/{exporter.popen.pid}/status").read_text()
            peak_kib = max(peak_kib, int(status_text.split("VmHWM:")[1].split()[0]))
        except (OSError, IndexError):
            pass
        time.sleep(0.02)
    assert exporter.popen.returncode == 0, exporter.log()
    assert "ledger.receipt_missing" in exporter.log() and "receipt-gone" in exporter.log()
    assert peak_kib < 200 * 1024, f"the exporter peaked at {peak_kib / 1024:.0f} MiB"

    with psycopg.connect(db) as conn:
        shipments = dict(conn.execute("SELECT batch_id, receipt FROM ledger_shipments").fetchall())
        counts = dict(conn.execute("SELECT batch_id, count(*) FROM ledger_movements GROUP BY batch_id").fetchall())
        edge = conn.execute("SELECT sku, quantity FROM ledger_movements WHERE batch_id = %s ORDER BY line", (edge_batch,)).fetchall()
        large_sum = conn.execute("SELECT sum(quantity) FROM ledger_movements WHERE batch_id = 'large-100k'").fetchone()
    assert shipments == {edge_batch: "whole", "receipt-gone": "missing", "large-100k": "whole"}
    assert counts == {edge_batch: 2, "large-100k": 100_000}
    assert edge == [(edge_sku, 7), ("0", 1)]
    assert large_sum == (sum(i % 9 + 1 for i in range(100_000)),)
    status, _, raw = system.request("GET", f"/api/stock-movements?sku={edge_sku}")
    assert status == 200 and json.loads(raw)["items"][0]["batchId"] == edge_batch


def test_a_ledger_at_an_older_schema_version_is_migrated_in_place(make_database: Any) -> None:
    """A database an earlier release migrated (0001 only, with a shipment in it) is
    brought to the latest version at start-up: its rows stay, its lists still read."""
    from importer.adapters.postgres.ledger import PostgresLedger
    from importer.adapters.postgres.migrations import latest_version, migrations
    from importer.domain.ledger import MovementFilter

    db = make_database()
    version, name, sql = migrations()[0]
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger_schema_versions (version integer PRIMARY KEY, name text NOT NULL,"
                     " applied_at timestamptz NOT NULL DEFAULT now())")
        conn.execute(sql.encode())
        conn.execute("INSERT INTO ledger_schema_versions (version, name) VALUES (%s, %s)", (version, name))
        conn.execute("INSERT INTO ledger_shipments VALUES ('main', 'old-1', 'o', 'j', 'c', 1, '{}', 5, 5, 0, 'whole')")
        conn.execute("INSERT INTO ledger_movements VALUES ('main', 'old-1', 1, 'OLD-A', 0, 3, 3, 'o', 5, 5, 0)")
    ledger = PostgresLedger(db, max_size=1).open()
    try:
        assert ledger.schema_status() == (1, latest_version())
        assert ledger.migrate() == [n for v, n, _ in migrations() if v > 1]
        assert ledger.schema_status() == (latest_version(), latest_version())
        assert ledger.migrate() == []  # once
        moves = list(ledger.list_movements(MovementFilter(owner="o"), limit=10, after=None))
        assert [(m.batch_id, m.sku, m.after) for m in moves] == [("old-1", "OLD-A", 3)]
    finally:
        ledger.close()


def test_verify_fails_while_the_exporter_is_sigkilled_past_the_bound(make_system: Any, make_database: Any) -> None:
    """A dead exporter (SIGKILLed, never restarted) leaves applied shipments out of the
    ledger: `importer ledger verify` fails, naming the lag, once the oldest of them is
    older than its bound; an exporter started again brings it back to clean."""
    system = make_system(IMPORTER_DATABASE_URL=make_database(), IMPORTER_LEDGER_INTERVAL="0.05")
    system.start_worker()
    system.start_http()
    exporter = system.start_ledger()
    assert system.post_csv("vk-0", b"sku,quantity\nVK-A,1\n")[0] == 202
    assert system.wait_state(job_id_for("vk-0"))["state"] == "completed"
    wait_for(lambda: "ledger.exported" in exporter.log(), 30, message="exported")
    exporter.kill()
    for i in range(1, 4):
        assert system.post_csv(f"vk-{i}", f"sku,quantity\nVK-A,{i}\n".encode())[0] == 202
        assert system.wait_state(job_id_for(f"vk-{i}"))["state"] == "completed"
    time.sleep(1.2)
    late = run_cli(system, "ledger", "verify", "--max-lag", "1")
    assert late.returncode == 1 and "main: 3 applied shipment(s) not in the ledger" in late.stdout, late.stdout + late.stderr
    system.start_ledger()
    wait_for(lambda: run_cli(system, "ledger", "verify", "--max-lag", "1").returncode == 0, 60, 0.5, message="clean again")


def test_a_second_application_the_exporter_meets_is_an_alarm_and_never_exported(make_system: Any, make_database: Any) -> None:
    """Forced by hand: the journal gets a second entry for a batch the ledger holds already
    (as a Redis behind the ledger would write when it applied it again). The exporter keeps
    the ledger's first and logs ledger.second_application at error, naming the batch; it
    used to drop it without a word."""
    db = make_database()
    system = make_system(IMPORTER_DATABASE_URL=db, IMPORTER_LEDGER_INTERVAL="0.05")
    system.start_worker()
    system.start_http()
    exporter = system.start_ledger()
    import_and_wait(system, "twice-1", shipment({"TW-A": 4}))
    wait_for(lambda: "ledger.exported" in exporter.log(), 30, message="exported")
    store = system.store()
    k = store.partition("main")
    marker = {key.decode(): value.decode() for key, value in store.client.hgetall(k.done("twice-1")).items()}
    store.client.xadd(k.journal, {"batchId": "twice-1", "jobId": marker["jobId"], "owner": marker["owner"],
                                  "contentSha256": marker["contentSha256"], "appliedAt": marker["appliedAt"],
                                  "result": marker["result"]})
    store.client.set(k.receipt("twice-1"), "TW-A,4,4\n")
    wait_for(lambda: "ledger.second_application" in exporter.log(), 30, message="the alarm")
    line = next(json.loads(l) for l in exporter.log().splitlines() if "ledger.second_application" in l)
    assert line["level"] == "error" and line["batchId"] == "twice-1" and line["location"] == "main", line
    with psycopg.connect(db) as conn:
        rows = conn.execute("SELECT before, quantity, after FROM ledger_movements WHERE batch_id = 'twice-1'").fetchall()
    assert rows == [(0, 4, 4)]  # the first application only
