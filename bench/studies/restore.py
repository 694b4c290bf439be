"""How fast a Redis that came back empty is brought forward from the ledger
(adapters/processes/ledger_sync.py): a ledger of N shipments of 3 rows (made
with SQL, not through imports), an empty Redis partition in front of it; the
time of the check that finds it behind, and of the restore (done markers read
with COPY and written pipelined, the stock as the movements end), per round.

    python -m bench.studies.restore --shipments 100000 --rounds 3 \\
        [--redis-url redis://127.0.0.1:6379/0] [--database-url postgresql://postgres@127.0.0.1:5432/postgres]

Each round uses a database of its own on that server (dropped after) and a
key prefix of its own on that Redis (deleted after). Target (issue 52):
100,000 shipments of 3 rows in under 10 s on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import psycopg
import redis

from importer.adapters.postgres.ledger import PostgresLedger
from importer.adapters.processes.ledger_sync import LedgerSync
from importer.adapters.redis.store import RedisStore
from importer.adapters.settings import Settings

T0 = 1_760_000_000_000


def fill(url: str, shipments: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO ledger_shipments (location, batch_id, owner, job_id, content_sha256, row_count, result,"
            " applied_at_ms, journal_ms, journal_seq, receipt)"
            " SELECT 'main', 'rs-' || i, 'owner-a', 'shipment-rs-' || i, md5(i::text) || md5(i::text), 3,"
            " '{\"imported\":3,\"batchId\":\"rs-' || i || '\"}', %s + i, %s + i, 0, 'whole'"
            " FROM generate_series(1, %s) AS i", (T0, T0, shipments))
        conn.execute(
            "INSERT INTO ledger_movements (location, batch_id, line, sku, before, quantity, after, owner, applied_at_ms,"
            " journal_ms, journal_seq)"
            " SELECT 'main', 'rs-' || i, l, sku, n - 1, 1, n, 'owner-a', %s + i, %s + i, 0 FROM ("
            "  SELECT i, l, 'SKU-' || ((i * 3 + l) %% 5000) AS sku,"
            "   row_number() OVER (PARTITION BY (i * 3 + l) %% 5000 ORDER BY i) AS n"
            "  FROM generate_series(1, %s) AS i, generate_series(1, 3) AS l) AS m", (T0, T0, shipments))
        conn.execute("INSERT INTO ledger_export_cursors (location, journal_ms, journal_seq, shipments) VALUES"
                     " ('main', %s, 0, %s)", (T0 + shipments, shipments))
        conn.execute("ANALYZE")


def one_round(redis_url: str, server_url: str, shipments: int) -> dict[str, float]:
    name = "importer_restore_" + uuid.uuid4().hex[:10]
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = server_url.rsplit("/", 1)[0] + "/" + name
    prefix = "{rs" + uuid.uuid4().hex[:8] + "}:"
    settings = Settings.from_env({"IMPORTER_REDIS_URL": redis_url, "IMPORTER_KEY_PREFIX": prefix,
                                  "IMPORTER_DATABASE_URL": url})
    client = redis.Redis.from_url(redis_url)
    ledger = PostgresLedger(url, max_size=2).open()
    try:
        ledger.migrate()
        started = time.perf_counter()
        fill(url, shipments)
        filled = time.perf_counter() - started
        store = RedisStore(client, settings, clock_ms=lambda: int(time.time() * 1000))
        sync = LedgerSync(store, ledger)
        started = time.perf_counter()
        behind = sync.check()
        checked = time.perf_counter() - started
        assert behind["main"].shipments == shipments, behind
        started = time.perf_counter()
        report = sync.restore("main")
        restored = time.perf_counter() - started
        assert report.markers_written == shipments and not sync.check(), report
        return {"fill_s": filled, "check_s": checked, "restore_s": restored,
                "memory_mib": client.info("memory")["used_memory"] / 2**20}
    finally:
        ledger.close()
        for key in client.scan_iter(match=prefix + "*", count=10_000):
            client.unlink(key)
        client.close()
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shipments", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    results = []
    for _ in range(args.rounds):
        res = one_round(args.redis_url, args.database_url, args.shipments)
        print({k: round(v, 3) for k, v in res.items()}, flush=True)
        results.append(res)
    med = {k: statistics.median(r[k] for r in results) for k in results[0]}
    print(f"\nrestore study: {args.shipments} shipments of 3 rows, {args.rounds} rounds, medians: "
          f"check {med['check_s']:.3f} s, restore {med['restore_s']:.2f} s "
          f"({args.shipments / med['restore_s']:.0f} shipments/s; target under 10 s)")


if __name__ == "__main__":
    main()
