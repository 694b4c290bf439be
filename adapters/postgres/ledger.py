"""The ledger in PostgreSQL (psycopg 3): the exporter's transactions, the
door's lookups of archived batches, and the history reads.

The SQL is in this module and in migrations/; every statement names its
location first, as every primary key starts with it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from importer.adapters.postgres.migrations import applied_version, latest_version, migrate
from importer.domain.jobs import ShipmentRecord
from importer.domain.ledger import (
    ArchivedShipment, JournalEntry, ReceiptSource, StreamId, movements,
)

_MOVEMENT_COLUMNS = (
    "location", "batch_id", "line", "sku", "before", "quantity", "after", "owner", "applied_at_ms",
    "journal_ms", "journal_seq",
)


class LedgerUnavailable(Exception):
    """PostgreSQL did not answer (down, refusing, read-only); the message stays in logs."""


@contextmanager
def ledger_errors() -> Iterator[None]:
    try:
        yield
    except (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction, PoolTimeout) as exc:
        raise LedgerUnavailable(f"{type(exc).__name__}: {exc}") from exc


class LedgerReads:
    """[ledger] History reads of the API (mixed into PostgresLedger)."""

    pool: ConnectionPool

    def shipment(self, location: str, batch_id: str) -> tuple[ShipmentRecord, bool] | None:
        """What the done marker of an archived batch said, and whether its receipt is whole."""
        with ledger_errors(), self.pool.connection() as conn:
            row = conn.execute(
                "SELECT owner, applied_at_ms, result, content_sha256, job_id, receipt FROM ledger_shipments"
                " WHERE location = %s AND batch_id = %s",
                (location, batch_id),
            ).fetchone()
        if row is None:
            return None
        record = ShipmentRecord(
            batch_id=batch_id, owner=str(row[0]), applied_at_ms=int(row[1]), result=json.loads(row[2]),
            content_sha256=str(row[3]), job_id=str(row[4]),
        )
        return record, row[5] == "whole"

    def stored_receipt(self, location: str, batch_id: str) -> bytes:
        """The receipt in its stored form ('sku,before,quantity\\n' per line, in file order),
        rebuilt from the movements: the same bytes apply.lua wrote."""
        with ledger_errors(), self.pool.connection() as conn:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT sku, before, quantity FROM ledger_movements WHERE location = %s AND batch_id = %s ORDER BY line",
                    (location, batch_id),
                )
                return "".join(f"{sku},{before},{quantity}\n" for sku, before, quantity in cur).encode()


class PostgresExportClaim:
    """A location's cursor row, locked by this transaction (ExportClaim)."""

    def __init__(self, conn: psycopg.Connection, location: str, cursor: StreamId) -> None:
        self.conn = conn
        self.location = location
        self.cursor = cursor

    def write(self, entries: list[JournalEntry], receipts: ReceiptSource) -> list[str]:
        # Idempotent by primary key: a shipment already in the ledger is left as it is.
        # One statement for the whole batch (unnest of one array per column).
        columns = list(zip(*(
            (e.location, e.batch_id, e.owner, e.job_id, e.content_sha256, e.rows, e.result, e.applied_at_ms,
             e.stream_id[0], e.stream_id[1])
            for e in entries
        )))
        rows = self.conn.execute(
            "INSERT INTO ledger_shipments (location, batch_id, owner, job_id, content_sha256, row_count, result,"
            " applied_at_ms, journal_ms, journal_seq, receipt)"
            " SELECT l, b, o, j, c, n, r, a, ms, seq, 'whole' FROM unnest("
            "%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::int[], %s::text[], %s::bigint[],"
            " %s::bigint[], %s::bigint[]) AS u(l, b, o, j, c, n, r, a, ms, seq)"
            " ON CONFLICT (location, batch_id) DO NOTHING RETURNING batch_id",
            [list(column) for column in columns],
        ).fetchall()
        inserted = {str(r[0]) for r in rows}
        missing: list[str] = []
        fresh = [e for e in entries if e.batch_id in inserted]
        if not fresh:
            return missing
        with self.conn.cursor() as cur:
            with cur.copy(f"COPY ledger_movements ({', '.join(_MOVEMENT_COLUMNS)}) FROM STDIN") as copy:
                for entry in fresh:
                    chunks = receipts(entry)
                    if chunks is None:
                        missing.append(entry.batch_id)
                        continue
                    for m in movements(chunks):
                        copy.write_row((
                            entry.location, entry.batch_id, m.line, m.sku, m.before, m.quantity, m.after,
                            entry.owner, entry.applied_at_ms, entry.stream_id[0], entry.stream_id[1],
                        ))
            if missing:
                cur.execute(
                    "UPDATE ledger_shipments SET receipt = 'missing' WHERE location = %s AND batch_id = ANY(%s)",
                    (self.location, missing),
                )
        return missing

    def advance(self, to: StreamId, shipments: int) -> None:
        self.conn.execute(
            "UPDATE ledger_export_cursors SET journal_ms = %s, journal_seq = %s, shipments = shipments + %s,"
            " updated_at = now() WHERE location = %s",
            (to[0], to[1], shipments, self.location),
        )
        self.cursor = to


class PostgresLedger(LedgerReads):
    """The Ledger port, plus the history reads of the API and the checks of the operator."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 8, connect_timeout: float = 5) -> None:
        self.url = url
        self.pool = ConnectionPool(
            url, min_size=min_size, max_size=max_size, open=False, timeout=connect_timeout,
            kwargs={"autocommit": True, "connect_timeout": max(1, int(connect_timeout))},
        )

    def open(self, *, wait: bool = True) -> "PostgresLedger":
        self.pool.open(wait=wait, timeout=30)
        return self

    def close(self) -> None:
        self.pool.close()

    def migrate(self) -> list[str]:
        with ledger_errors(), self.pool.connection() as conn:
            return migrate(conn)

    def schema_status(self) -> tuple[int, int]:
        """(the version the database holds, the version this release expects)."""
        with ledger_errors(), self.pool.connection() as conn:
            return applied_version(conn), latest_version()

    # -- the exporter ----------------------------------------------------------

    @contextmanager
    def claim(self, location: str) -> Iterator[PostgresExportClaim | None]:
        with ledger_errors(), self.pool.connection() as conn:
            conn.execute(
                "INSERT INTO ledger_export_cursors (location, journal_ms, journal_seq) VALUES (%s, 0, 0)"
                " ON CONFLICT (location) DO NOTHING",
                (location,),
            )
            with conn.transaction():
                row = conn.execute(
                    "SELECT journal_ms, journal_seq FROM ledger_export_cursors WHERE location = %s"
                    " FOR UPDATE SKIP LOCKED",
                    (location,),
                ).fetchone()
                yield None if row is None else PostgresExportClaim(conn, location, (int(row[0]), int(row[1])))

    def cursor(self, location: str) -> StreamId:
        with ledger_errors(), self.pool.connection() as conn:
            row = conn.execute(
                "SELECT journal_ms, journal_seq FROM ledger_export_cursors WHERE location = %s", (location,)
            ).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def cursors(self) -> dict[str, tuple[StreamId, Any]]:
        """Every location's cursor and the time it last moved."""
        with ledger_errors(), self.pool.connection() as conn:
            rows = conn.execute("SELECT location, journal_ms, journal_seq, updated_at FROM ledger_export_cursors").fetchall()
        return {str(r[0]): ((int(r[1]), int(r[2])), r[3]) for r in rows}

    # -- the door --------------------------------------------------------------

    def archived(self, location: str, batch_ids: list[str]) -> dict[str, ArchivedShipment]:
        if not batch_ids:
            return {}
        with ledger_errors(), self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT batch_id, content_sha256, result FROM ledger_shipments WHERE location = %s AND batch_id = ANY(%s)",
                (location, batch_ids),
            ).fetchall()
        return {str(r[0]): ArchivedShipment(str(r[1]), str(r[2])) for r in rows}

