"""Importer on a real Redis Cluster (IMPORTER_REDIS_CLUSTER=1): shipments to
six locations whose partitions sit on all three masters, the whole path
(POST, worker, status, receipts, list, events, console), every Lua script
run there, and real faults (a master SIGKILLed mid-drain, a location's slot
migrated while the others are busy) followed by the invariant checker per
location."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from importer.adapters.bootstrap import clock_ms, redis_client
from importer.adapters.redis.keys import Keys
from importer.adapters.redis.scripts import SCRIPT_NAMES, lua_source
from importer.domain.locations import MAIN
from importer.domain.receipt import decode_receipt
from importer.domain.shipment import job_id_for
from tests.cluster.cluster_nodes import LocalCluster
from tests.faults.harness import FAULT_ENV, Driver, documented_bound
from tests.integration.conftest import require_transport
from tests.integration.support import FIXTURES, ROOT, ProbeStore, System, delete_rabbitmq_queues, wait_for

pytestmark = pytest.mark.integration

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()
SEED_SKUS = {"WIDGET-RED-01": 10, "GADGET-BLU-02": 25, "SPROCKET-07": 5}


def spread_locations(cluster: LocalCluster, prefix: str, per_master: int = 2) -> dict[str, list[str]]:
    """Locations (main first) chosen so that each master holds ``per_master`` of
    their partitions: master port -> locations (CLUSTER KEYSLOT of each partition's keys)."""
    by_master: dict[str, list[str]] = {str(m.port): [] for m in cluster.masters()}
    for i in range(-1, 200):
        location = MAIN if i < 0 else f"wh-{i}"
        port = str(cluster.node_of_key(Keys(prefix, location).stock).port)
        if len(by_master[port]) < per_master:
            by_master[port].append(location)
        if all(len(v) == per_master for v in by_master.values()):
            return by_master
    raise AssertionError(f"could not spread locations over the masters: {by_master}")


def declared(system: System, by_master: dict[str, list[str]]) -> dict[str, list[str]]:
    """The spread locations, declared as an operator would (importer locations add)."""
    system.store().declare_locations([loc for locs in by_master.values() for loc in locs])
    return by_master


def cluster_system(cluster: LocalCluster, tmp_path: Path, transport: str = "redis", **env: str) -> System:
    require_transport(transport)
    # Every node named: a process (re)started while one is down still finds the cluster.
    url = ",".join(f"redis://127.0.0.1:{node.port}" for node in cluster.nodes)
    return System(url, tmp_path, env_overrides={"IMPORTER_REDIS_CLUSTER": "1", **env}, transport=transport)


def _get(system: System, path: str, key: str | None = "default") -> tuple[int, Any]:
    status, _, raw = system.request("GET", path, key=key)
    return status, json.loads(raw) if raw else None


@pytest.mark.parametrize("transport", ["redis", "rabbitmq"])
def test_six_locations_on_three_masters_end_to_end(
    redis_cluster: LocalCluster, tmp_path: Path, transport: str, make_database: Any,
) -> None:
    # [ledger] on, with no hot window and no horizon: the exporter and its trims run on the cluster too.
    system = cluster_system(
        redis_cluster, tmp_path, transport, IMPORTER_DATABASE_URL=make_database(),
        IMPORTER_LEDGER_HOT_WINDOW="0", IMPORTER_IDEMPOTENCY_HORIZON="0",
    )
    try:
        _end_to_end(redis_cluster, system)
    finally:
        system.stop_all()
        delete_rabbitmq_queues(system)


def _end_to_end(cluster: LocalCluster, system: System) -> None:
    by_master = declared(system, spread_locations(cluster, system.prefix))
    locations = [loc for locs in by_master.values() for loc in locs]
    assert len(locations) == 6 and MAIN in locations and len(by_master) == 3
    system.start_worker()
    system.start_http()
    events_out = system.workdir / "events.jsonl"
    with events_out.open("wb") as sink:
        observer = subprocess.Popen(
            [sys.executable, "-m", "importer.adapters.processes.cli", "events", "--json", "--from", "0"],
            env={**system.env, "IMPORTER_LOG_FORMAT": "text"}, stdout=sink, stderr=subprocess.DEVNULL,
        )
    try:
        for location in locations:
            status, _, raw = system.request(
                "POST", f"/api/imports?batchId=c-1&location={location}", body=SEED, ctype="text/csv",
            )
            assert status == 202, raw
        # A bad file at one location (fail.lua, the rejection report) and its owner's retry refused (retry.lua).
        status, _, raw = system.request(
            "POST", "/api/imports", ctype="application/json",
            body=json.dumps({"batchId": "c-bad", "location": locations[-1], "csv": "sku,quantity\nX,many\n"}).encode(),
        )
        assert status == 202, raw
        bad_job = json.loads(raw)["jobId"]
        # A file over IMPORTER_ONE_STEP_MAX_BYTES takes the separate steps (start.lua, then apply.lua).
        big = b"sku,quantity\n" + b"".join(b"BIG-%05d,%d\n" % (i, i % 7 + 1) for i in range(1500))
        assert len(big) > 16384
        status, _, raw = system.request("POST", f"/api/imports?batchId=c-big&location={locations[2]}", body=big, ctype="text/csv")
        assert status == 202, raw
        # One bulk request with a shipment at every location (enqueue_many.lua in each one's slot, group messages).
        lines = b"".join(json.dumps({"batchId": "c-bulk", "location": loc, "csv": "sku,quantity\nBULK-C,4\n"}).encode() + b"\n"
                         for loc in locations)
        status, _, raw = system.request("POST", "/api/imports/bulk", body=lines, ctype="application/x-ndjson")
        assert status == 200 and [r["status"] for r in json.loads(raw)["results"]] == [202] * len(locations), raw
        for location in locations:
            record = system.wait_state(job_id_for("c-1", location))
            assert (record["state"], record["location"]) == ("completed", location), record
            assert system.wait_state(job_id_for("c-bulk", location))["state"] == "completed"
            assert system.store().stock_of(["BULK-C"], location) == {"BULK-C": 4}
        assert system.wait_state(bad_job)["state"] == "failed"
        assert system.wait_state(job_id_for("c-big", locations[2]))["state"] == "completed"
        status, _, report = system.request("GET", f"/api/imports/{bad_job}/rejections.csv")
        assert status == 200 and b"csv.bad_quantity" in report
        status, _, raw = system.request("POST", f"/api/imports/{bad_job}/retry")
        assert status == 409 and json.loads(raw)["code"] == "job.not_retryable", raw

        store = system.store()
        for location in locations:
            assert store.stock_of(list(SEED_SKUS), location) == SEED_SKUS
            status, receipt = _get(system, f"/api/shipments/c-1/receipt?location={location}")
            assert status == 200 and [i["after"] for i in receipt["items"]] == list(SEED_SKUS.values())
            status, shipment = _get(system, f"/api/shipments/c-1?location={location}")
            assert status == 200 and shipment["location"] == location
        # [ledger] one exporter pass: every location's shipment in PostgreSQL, its receipt
        # then dropped from Redis and read from the ledger with the same bytes.
        receipts = {loc: system.request("GET", f"/api/shipments/c-1/receipt?location={loc}")[2] for loc in locations}
        assert system.start_ledger(once=True).popen.wait(60) == 0
        import psycopg

        with psycopg.connect(system.env["IMPORTER_DATABASE_URL"]) as conn:
            held = conn.execute("SELECT location, count(*) FROM ledger_movements WHERE batch_id = 'c-1' GROUP BY location").fetchall()
        assert dict(held) == {loc: len(SEED_SKUS) for loc in locations}
        for location in locations:
            assert store.client.exists(store.partition(location).receipt("c-1")) == 0
            assert system.request("GET", f"/api/shipments/c-1/receipt?location={location}")[2] == receipts[location]
        status, page = _get(system, "/api/imports?limit=100")
        assert status == 200 and len(page["items"]) == 8 + len(locations)  # c-1 at each, c-bad, c-big, c-bulk at each
        status, page = _get(system, f"/api/imports?location={locations[1]}")
        assert [i["id"] for i in page["items"]] == [job_id_for("c-bulk", locations[1]), job_id_for("c-1", locations[1])]
        status, page = _get(system, "/api/imports", key=system.other_key)
        assert page["items"] == []
        status, _, html = system.request("GET", "/", key=None)
        assert status == 200 and b"<html" in html.lower()
        status, health = _get(system, "/health", key=None)
        assert status == 200 and health["status"] == "ok", health

        def completed_seen() -> set[str]:
            lines = [json.loads(x) for x in events_out.read_text().splitlines() if x.strip()]
            return {e["jobId"] for e in lines if e["event"] == "completed"}

        # c-1 and c-bulk at each location, c-big
        wait_for(lambda: len(completed_seen()) == 1 + 2 * len(locations), 15, message="the observer saw every location's import")

        # reconcile.lua and retain_drop.lua run only when a job is due or a
        # record is to be removed: give them one of each, with a store whose
        # grace and failed age are short (the worker's own passes keep theirs).
        settings = dataclasses.replace(system.settings, waiting_grace_s=0.1, keep_failed_age_s=0)
        upkeep = ProbeStore(redis_client(settings), settings, clock_ms=clock_ms)
        unsent = job_id_for("c-unsent", locations[1])
        assert upkeep.enqueue(job_id=unsent, batch_id="c-unsent", owner="owner-a", content_sha256="", upload_id="u1",
                              csv=SEED).kind == "created"
        time.sleep(0.3)
        assert unsent in [job_id for job_id, _, _ in upkeep.reconcile()]
        upkeep.mark_sent(unsent)  # as a producer on RabbitMQ does once its publish is confirmed (mark_sent.lua)
        # [ops] the operators' reads and acts, each location's on its own node.
        queue = upkeep.location_queue(locations[1])
        assert queue.location == locations[1] and queue.waiting >= 1
        assert upkeep.workers_now() and upkeep.failed_imports(locations[0], code=None, limit=5)[0] is not None
        upkeep.set_intake(locations[1], paused=True, by="ops")
        assert list(upkeep.intake()) == [locations[1]]
        upkeep.set_intake("*", paused=False, by="ops")
        upkeep.record_action("ops", "intake", {"location": "*"})
        assert upkeep.actions(limit=5, before=None)[0][0]["by"] == "ops"
        wait_for(lambda: upkeep.reconcile() is not None and upkeep.get_job(bad_job) is None, 15,
                 message="the failed record removed by retention")
        upkeep.client.close()
    finally:
        observer.send_signal(signal.SIGTERM)
        assert observer.wait(timeout=10) == 0

    # Every script ran on the cluster, where its keys live, without a cross-slot error.
    client = cluster.client()
    try:
        ran = set()
        for master in cluster.masters():
            node = master.client()
            loaded = node.script_exists(*[hashlib.sha1(lua_source(n).encode()).hexdigest() for n in SCRIPT_NAMES])
            ran |= {n for n, yes in zip(SCRIPT_NAMES, loaded) if yes}
            errors = node.info("errorstats")
            assert not any("CROSSSLOT" in k for k in errors), errors
        needed = set(SCRIPT_NAMES) - {"renew"}  # renew: only for an attempt longer than a reconciler tick
        assert needed <= ran, f"never ran on the cluster: {sorted(needed - ran)}"
    finally:
        client.close()


# -- faults -------------------------------------------------------------------------------


def check_locations(system: System, driver: Driver, *, since: float, bound: float) -> dict[str, Any]:
    """The invariants, per location: stock = the sum of the distinct applied
    batches' rows, one journal entry and one receipt each, generation = their
    number; every accepted job final within ``bound``; completed <=> applied; no 500."""
    store = system.store()
    client = store.client
    accepted = driver.accepted()
    jobs = {job_id_for(p.batch_id, p.location or MAIN): p for p in accepted}

    def states() -> dict[str, str]:
        out = {}
        for job_id in jobs:
            raw = client.hget(store.partition_of(job_id).job(job_id), "state")
            out[job_id] = raw.decode() if raw else ""
        return out

    final_within = None
    while True:
        now = states()
        if all(s in ("completed", "failed") for s in now.values()):
            final_within = time.monotonic() - since
            break
        if time.monotonic() - since > bound:
            break
        time.sleep(0.3)
    stuck = [j for j, s in now.items() if s not in ("completed", "failed")]
    assert not stuck, (
        f"{len(stuck)} accepted imports not final {bound:.0f}s after the fault: "
        f"{[(j, client.hgetall(store.partition_of(j).job(j))) for j in stuck[:3]]}"
    )
    per_location: Counter[str] = Counter()
    for location in {p.location or MAIN for p in driver.posts}:
        k = store.partition(location)
        posted = {p.batch_id: p.rows for p in driver.posts if (p.location or MAIN) == location}
        journal = [f[b"batchId"].decode() for _, f in client.xrange(k.journal)]
        assert len(journal) == len(set(journal)), f"{location}: a batch in the journal twice"
        applied = {b for b in posted if client.exists(k.done(b))}
        assert set(journal) == applied, f"{location}: journal != done markers"
        expected: Counter[str] = Counter()
        for batch_id in applied:
            expected.update(posted[batch_id])
        stock = {key.decode(): int(v) for key, v in client.hgetall(k.stock).items()}
        assert {s: n for s, n in stock.items() if n} == {s: n for s, n in expected.items() if n}, f"{location}: stock"
        assert int(client.get(k.generation) or 0) == len(applied), f"{location}: generation"
        for batch_id in applied:
            lines = decode_receipt(client.get(k.receipt(batch_id)) or b"")
            assert {line.sku: line.after - line.before for line in lines} == posted[batch_id], f"{location}: receipt"
        for p in accepted:
            if (p.location or MAIN) == location:
                state = now[job_id_for(p.batch_id, location)]
                assert (state == "completed") == (p.batch_id in applied), f"{p.batch_id}@{location}: {state}"
        per_location[location] = len(applied)
    statuses = driver.statuses()
    assert 500 not in statuses, f"answers of 500: {statuses}"
    assert sum(per_location.values()) == len(accepted) - sum(1 for s in now.values() if s == "failed")
    figures = {
        "jobs": len(jobs), "completed": sum(per_location.values()), "stuck": 0,
        "max_time_to_final": round(final_within or 0.0, 1), "statuses": dict(sorted(statuses.items())),
        "max_request": round(driver.max_duration(), 1), "locations": dict(sorted(per_location.items())),
    }
    print(f"[faults] {os.environ.get('PYTEST_CURRENT_TEST', '?').split(' ')[0]}: {json.dumps(figures)}")
    return figures


def test_a_master_sigkilled_mid_drain_fails_over_and_every_import_ends_once(
    fresh_cluster: Any, tmp_path: Path, make_database: Any,
) -> None:
    cluster = fresh_cluster(masters=3, replicas_per_master=1)
    # [ledger] on, exporting throughout (the hot window keeps the journal for the checks below)
    system = cluster_system(cluster, tmp_path, **FAULT_ENV, IMPORTER_DATABASE_URL=make_database(),
                            IMPORTER_LEDGER_INTERVAL="0.05")
    try:
        by_master = declared(system, spread_locations(cluster, system.prefix))
        locations = tuple(loc for locs in by_master.values() for loc in locs)
        system.start_worker(threads=4)
        system.start_http(workers=2)
        system.start_ledger()
        driver = Driver(system, 300, locations=locations).start()
        assert driver.posted.wait(60), "a quarter of the POSTs accepted before the fault"
        # The master of two busy locations (not main's: the queue's slot is another scenario's).
        victim = next(m for m in cluster.masters() if MAIN not in by_master[str(m.port)])
        cluster.kill(victim, signal.SIGKILL)
        promoted = cluster.failover_wait(victim, timeout=60)
        fault_over = time.monotonic()
        print(f"[faults] master :{victim.port} killed; replica :{promoted.port} took over")
        driver.join(180)
        check_locations(system, driver, since=fault_over, bound=documented_bound(system.env) + 30)
        check_ledger(system, locations)
    finally:
        system.stop_all()


def check_ledger(system: System, locations: tuple[str, ...]) -> None:
    """[ledger] Every applied batch in the ledger once (its movements equal to its
    receipt), and `importer ledger verify` clean."""
    import psycopg

    store = system.store()
    database = system.env["IMPORTER_DATABASE_URL"]

    def caught_up() -> bool:
        with psycopg.connect(database) as conn:
            held = conn.execute("SELECT count(*) FROM ledger_shipments").fetchone()
        return bool(held) and held[0] == sum(store.client.xlen(store.partition(loc).journal) for loc in locations)

    wait_for(caught_up, 60, 0.2, message="the ledger caught up")
    with psycopg.connect(database) as conn:
        for location in locations:
            k = store.partition(location)
            journal = {f[b"batchId"].decode() for _, f in store.client.xrange(k.journal)}
            held = {r[0] for r in conn.execute("SELECT batch_id FROM ledger_shipments WHERE location = %s", (location,))}
            assert held == journal, f"{location}: ledger != journal"
            for batch_id in journal:
                moves = conn.execute(
                    "SELECT sku, before, after FROM ledger_movements WHERE location = %s AND batch_id = %s ORDER BY line",
                    (location, batch_id),
                ).fetchall()
                lines = decode_receipt(store.client.get(k.receipt(batch_id)) or b"")
                assert [(m[0], m[1], m[2]) for m in moves] == [(x.sku, x.before, x.after) for x in lines], batch_id
    verified = subprocess.run([sys.executable, "-m", "importer.adapters.processes.cli", "ledger", "verify"],
                              env=system.env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_an_import_is_accepted_only_once_a_replica_has_it(fresh_cluster: Any, tmp_path: Path) -> None:
    """Redis replicates asynchronously: a record a master acknowledged can be
    lost in a failover. So a POST answers 202 only once a replica of its
    partition's master has the record (IMPORTER_REDIS_WAIT_REPLICAS, 1 by
    default); while that replica is stopped (SIGSTOP) the POST answers 503,
    a safe retry, within the bound, and the retry after it is back is accepted and imported once."""
    cluster = fresh_cluster(masters=3, replicas_per_master=1)
    system = cluster_system(cluster, tmp_path, IMPORTER_REDIS_WAIT_REPLICAS_MS="500")
    try:
        by_master = declared(system, spread_locations(cluster, system.prefix, per_master=1))
        port, (location,) = next((p, locs) for p, locs in by_master.items() if locs != [MAIN])
        master = cluster.node_by_port(int(port))
        assert master is not None
        (replica,) = cluster.replicas_of(master)
        system.start_worker(threads=2)
        system.start_http()

        def post(batch_id: str) -> tuple[int, Any]:
            status, _, body = system.request(
                "POST", f"/api/imports?batchId={batch_id}&location={location}", body=SEED, ctype="text/csv",
            )
            return status, json.loads(body)

        on_replica = replica.raw_client()
        on_replica.execute_command("READONLY")
        job_key = Keys(system.prefix, location).job(job_id_for("replicated-1", location))
        status, body = post("replicated-1")
        assert status == 202, body
        assert on_replica.hget(job_key, "batchId") == b"replicated-1", "the replica has the record when 202 is sent"

        replica_pid = replica.pid
        assert replica_pid is not None
        os.kill(replica_pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            status, body = post("replicated-2")
            took = time.monotonic() - started
        finally:
            os.kill(replica_pid, signal.SIGCONT)
        assert status == 503, body
        assert body["code"] == "service.unavailable", body
        assert took < float(system.env.get("IMPORTER_REDIS_SOCKET_TIMEOUT", "10")) + 1, took

        status, body = post("replicated-2")  # the client's retry, the replica back
        assert status == 202, body

        # A bulk request waits once for the partition's replica, not once per shipment.
        on_master = master.raw_client()
        waits_before = on_master.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)
        bulk = b"".join(json.dumps({"batchId": f"replicated-b{n}", "csv": SEED.decode(), "location": location}).encode() + b"\n"
                        for n in range(20))
        status, _, answer = system.request("POST", "/api/imports/bulk", body=bulk, ctype="application/x-ndjson")
        assert status == 200, answer
        assert [r["status"] for r in json.loads(answer)["results"]] == [202] * 20
        assert on_master.info("commandstats").get("cmdstat_wait", {}).get("calls", 0) - waits_before == 1
        for n in range(20):  # every record on the replica when the answer is sent
            assert on_replica.hget(Keys(system.prefix, location).job(job_id_for(f"replicated-b{n}", location)), "batchId")

        batches = ["replicated-1", "replicated-2", *(f"replicated-b{n}" for n in range(20))]
        for batch_id in batches:
            assert system.wait_state(job_id_for(batch_id, location))["state"] == "completed"
        stock = cluster.client().hgetall(Keys(system.prefix, location).stock)
        assert {k.decode(): int(v) for k, v in stock.items()} == {sku: len(batches) * n for sku, n in SEED_SKUS.items()}
        on_replica.close()
    finally:
        system.stop_all()


class Drivers:
    """Several drivers' POSTs seen as one, for the checker."""

    def __init__(self, *drivers: Driver) -> None:
        self.drivers = drivers
        self.posts = [p for d in drivers for p in d.posts]

    def accepted(self) -> list[Any]:
        return [p for d in self.drivers for p in d.accepted()]

    def statuses(self) -> Counter[int]:
        return sum((d.statuses() for d in self.drivers), Counter())

    def max_duration(self) -> float:
        return max(d.max_duration() for d in self.drivers)


@pytest.mark.parametrize("which", ["another", "main"])
def test_a_busy_locations_slot_migrates_under_load(redis_cluster: LocalCluster, tmp_path: Path, which: str) -> None:
    """A location's slot moved to another master, key batch by key batch,
    while that very location (and every other) takes POSTs and imports:
    before, during and after, every import ends once (docs/scaling-out.md,
    "Resharding"). Every script declares every key it touches, so a script
    that meets a key already moved gets ASK or TRYAGAIN (retried, or a 503 the
    producer retries) instead of recreating it on the old node, which would
    stop the move with BUSYKEY and split the job's records. ``main``'s slot
    also holds the control keys (every location's POST takes its rate token
    and door check there) and main's queue."""
    system = cluster_system(redis_cluster, tmp_path, **FAULT_ENV)
    try:
        by_master = declared(system, spread_locations(redis_cluster, system.prefix))
        locations = tuple(loc for locs in by_master.values() for loc in locs)
        moving = MAIN if which == "main" else next(loc for loc in locations if loc != MAIN)
        others = tuple(loc for loc in locations if loc != moving)
        slot = redis_cluster.keyslot(Keys(system.prefix, moving).stock)
        source = redis_cluster.master_of_slot(slot)
        target = next(m for m in redis_cluster.masters() if m.port != source.port)
        system.start_worker(threads=4)
        system.start_http(workers=2)
        before = Driver(system, 60, locations=(moving,), seed=1).start()
        before.join(120)
        check_locations(system, before, since=time.monotonic(), bound=documented_bound(system.env) + 30)
        during = Driver(system, 300, locations=others, seed=2).start()
        busy = Driver(system, 200, locations=(moving,), seed=4, threads=2).start()
        assert during.posted.wait(60) and busy.posted.wait(60)
        def answered() -> int:  # the moving location's POSTs answered so far (202, 503, ...)
            return sum(len(p.statuses) for p in busy.posts)

        # Each job's own keys first, the location's shared ones (stock, indexes,
        # streams) last: the longest time in which scripts still run on the old
        # node, where one that wrote an undeclared key already moved (a job's
        # event stream) would recreate it there.
        partition = Keys(system.prefix, moving)
        per_job = tuple(name.encode() for name in (partition.job(""), partition.job_events(""), partition.upload("")))
        migration = redis_cluster.begin_migration(slot, target)
        began, answered_before = time.monotonic(), answered()
        moved = 0
        while migration.keys_left():  # a few keys at a time, while the POSTs and imports go on
            moved += migration.move_batch(5, first=lambda key: key.startswith(per_job))
            time.sleep(0.05)
        migration.finish()
        ended, answered_during = time.monotonic(), answered() - answered_before
        assert redis_cluster.master_of_slot(slot).port == target.port
        accepted = sum(1 for p in busy.posts if p.accepted_at is not None and began <= p.accepted_at <= ended)
        print(f"[faults] slot {slot} of {moving}: {moved} keys moved :{source.port} -> :{target.port} "
              f"in {ended - began:.1f}s; meanwhile {answered_during} of its POSTs answered, {accepted} accepted")
        assert answered_during > 0, "the moving location took POSTs during the move"
        after = Driver(system, 60, locations=(moving,), seed=3).start()
        fault_over = time.monotonic()
        during.join(180)
        busy.join(180)
        after.join(180)
        check_locations(
            system, Drivers(before, during, busy, after), since=fault_over, bound=documented_bound(system.env) + 30,
        )
    finally:
        system.stop_all()


def test_an_evicting_master_anywhere_is_refused(redis_cluster: LocalCluster, tmp_path: Path) -> None:
    """Every master must be noeviction (an evicted done marker could let a
    shipment be added twice): `importer doctor` fails on the one that is not,
    and `importer worker` refuses to start."""
    system = cluster_system(redis_cluster, tmp_path)
    master = redis_cluster.masters()[-1].client()
    master.config_set("maxmemory-policy", "allkeys-lru")
    try:
        doctor = subprocess.run(
            [sys.executable, "-m", "importer.adapters.processes.cli", "doctor"],
            env=system.env, capture_output=True, text=True, timeout=60,
        )
        assert doctor.returncode != 0, doctor.stdout
        assert "[FAIL] maxmemory-policy: allkeys-lru" in doctor.stdout, doctor.stdout
        worker = subprocess.run(
            [sys.executable, "-m", "importer.adapters.processes.cli", "worker"],
            env=system.env, capture_output=True, text=True, timeout=60,
        )
        assert worker.returncode != 0 and "noeviction" in worker.stdout + worker.stderr
    finally:
        master.config_set("maxmemory-policy", "noeviction")
        master.close()


def test_a_location_whose_partition_came_back_empty_is_caught_alone_and_brought_forward(
    redis_cluster: LocalCluster, tmp_path: Path, make_database: Any,
) -> None:
    """[ledger] One location's partition emptied on its master (as a node that came back
    without its data) while the others hold theirs: only that location is behind the
    ledger (503 store.behind_ledger there), the others keep taking shipments, and
    `importer ledger restore` brings it forward: its stock is the ledger's again."""
    import psycopg

    database = make_database()
    system = cluster_system(redis_cluster, tmp_path, IMPORTER_DATABASE_URL=database, IMPORTER_LEDGER_INTERVAL="0.05",
                            IMPORTER_LEDGER_AUTO_RESTORE="0")
    locations = [loc for locs in declared(system, spread_locations(redis_cluster, system.prefix, per_master=1)).values()
                 for loc in locs]
    lost = next(loc for loc in locations if loc != MAIN)
    try:
        system.start_worker()
        system.start_http()
        system.start_ledger()
        for loc in locations:
            for i in range(5):
                status, _, raw = system.request("POST", f"/api/imports?batchId=cl-{i}&location={loc}",
                                                body=f"sku,quantity\nCL-{i % 2},{i + 1}\n".encode(), ctype="text/csv")
                assert status == 202, raw
        for loc in locations:
            for i in range(5):
                assert system.wait_state(job_id_for(f"cl-{i}", loc), timeout=60)["state"] == "completed"

        def exported(count: int) -> bool:
            with psycopg.connect(database) as conn:
                row = conn.execute("SELECT count(*) FROM ledger_shipments").fetchone()
            return bool(row and row[0] == count)
        wait_for(lambda: exported(5 * len(locations)), 60, 0.2, message="exported")

        node = redis_cluster.node_of_key(Keys(system.prefix, lost).stock)
        direct = redis.Redis(port=node.port)
        emptied = [key for key in direct.scan_iter(match=Keys(system.prefix, lost).prefix + "*", count=1000)]
        assert emptied and direct.delete(*emptied) == len(emptied)
        direct.close()
        wait_for(lambda: json.loads(system.request("GET", "/health", key=None)[2]).get("reason") == "store_behind_ledger",
                 30, 0.1, message="/health says behind")
        behind = json.loads(system.request("GET", "/health", key=None)[2])["ledger"]["behind"]
        assert [b["location"] for b in behind] == [lost], behind
        status, _, raw = system.request("POST", f"/api/imports?batchId=cl-9&location={lost}", body=b"sku,quantity\nCL-0,1\n",
                                        ctype="text/csv")
        assert status == 503 and json.loads(raw)["code"] == "store.behind_ledger", raw
        other = next(loc for loc in locations if loc != lost)
        status, _, raw = system.request("POST", f"/api/imports?batchId=cl-9&location={other}", body=b"sku,quantity\nCL-0,1\n",
                                        ctype="text/csv")
        assert status == 202, raw
        assert system.wait_state(job_id_for("cl-9", other), timeout=60)["state"] == "completed"

        restored = subprocess.run([sys.executable, "-m", "importer.adapters.processes.cli", "ledger", "restore"],
                                  env=system.env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert restored.returncode == 0 and f"{lost}: the ledger holds 5 shipment(s); wrote 5 done marker(s)" in restored.stdout, \
            restored.stdout + restored.stderr
        assert system.store().stock_of(["CL-0", "CL-1"], lost) == {"CL-0": 1 + 3 + 5, "CL-1": 2 + 4}
        def replayed() -> bool:  # each process drops the mark from its view within a second
            status, _, raw = system.request("POST", f"/api/imports?batchId=cl-3&location={lost}",
                                            body=b"sku,quantity\nCL-1,4\n", ctype="text/csv")
            assert status in (202, 503), raw
            return status == 202
        wait_for(replayed, 10, 0.2, message="taken again")
        assert system.wait_state(job_id_for("cl-3", lost), timeout=60)["result"].get("replay") is True
    finally:
        system.stop_all()


def test_one_master_restored_from_an_older_rdb_is_caught_alone_and_brought_forward(
    fresh_cluster: Any, tmp_path: Path, make_database: Any,
) -> None:
    """[ledger] A cluster of 3 masters without replicas, RDB only: SAVE on the master of one
    location, more shipments everywhere (applied and exported), that master SIGKILLed and
    started again on its older dump.rdb (same node id) while the other masters keep their
    data. Only that location is behind (503 store.behind_ledger there), the others take
    shipments; the exporter brings it forward by itself: stock the ledger's, a batch
    applied after the snapshot a replay."""
    import shutil

    import psycopg

    cluster = fresh_cluster(masters=3, replicas_per_master=0, extra_config={"appendonly": "no"})
    database = make_database()
    system = cluster_system(cluster, tmp_path, IMPORTER_DATABASE_URL=database, IMPORTER_LEDGER_INTERVAL="0.05",
                            **{k: v for k, v in FAULT_ENV.items() if k != "IMPORTER_REDIS_SOCKET_TIMEOUT"})
    locations = [loc for locs in declared(system, spread_locations(cluster, system.prefix, per_master=1)).values()
                 for loc in locs]
    lost = next(loc for loc in locations if loc != MAIN)
    node = cluster.node_of_key(Keys(system.prefix, lost).stock)

    def post(batch: str, location: str, rows: bytes) -> int:
        status, _, _ = system.request("POST", f"/api/imports?batchId={batch}&location={location}", body=rows,
                                      ctype="text/csv")
        return status

    def send(batches: range) -> None:
        for loc in locations:
            for i in batches:
                assert post(f"cr-{i}", loc, f"sku,quantity\nCR-{i % 2},{i + 1}\n".encode()) == 202
        for loc in locations:
            for i in batches:
                assert system.wait_state(job_id_for(f"cr-{i}", loc), timeout=60)["state"] == "completed"

    def exported(count: int) -> None:
        def done() -> bool:
            with psycopg.connect(database) as conn:
                row = conn.execute("SELECT count(*) FROM ledger_shipments").fetchone()
            return bool(row and row[0] == count)
        wait_for(done, 60, 0.2, message=f"{count} exported")

    try:
        system.start_worker()
        system.start_http()
        exporter = system.start_ledger()
        send(range(0, 4))
        exported(4 * len(locations))
        node.client().save()
        backup = tmp_path / "older.rdb"
        shutil.copy(node.dir / "dump.rdb", backup)
        send(range(4, 8))
        exported(8 * len(locations))
        cluster.kill(node)
        shutil.copy(backup, node.dir / "dump.rdb")
        cluster.restart(node)

        wait_for(lambda: "ledger.restored" in exporter.log(), 60, 0.2, message="brought forward by the exporter")
        behind = [json.loads(line) for p in system.procs for line in p.log().splitlines() if '"ledger.redis_behind"' in line]
        assert [b["location"] for b in behind] == [lost] and behind[0]["shipments"] == 4, behind
        other = next(loc for loc in locations if loc != lost)
        wait_for(lambda: post("cr-9", other, b"sku,quantity\nCR-0,1\n") == 202, 30, 0.2, message="another location takes")
        assert system.wait_state(job_id_for("cr-9", other), timeout=60)["state"] == "completed"
        assert system.store().stock_of(["CR-0", "CR-1"], lost) == {"CR-0": 1 + 3 + 5 + 7, "CR-1": 2 + 4 + 6 + 8}
        wait_for(lambda: post("cr-6", lost, b"sku,quantity\nCR-0,7\n") == 202, 30, 0.2, message="taken again")
        assert system.wait_state(job_id_for("cr-6", lost), timeout=60)["result"].get("replay") is True
    finally:
        system.stop_all()
