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
from psycopg_pool import ConnectionPool

from importer.adapters.postgres.migrations import applied_version, latest_version, migrate
from importer.adapters.postgres.errors import LedgerUnavailable, ledger_errors
from importer.adapters.postgres.sync import LedgerSyncReads
from importer.domain.errors import LedgerUnreachable
from importer.domain.jobs import ShipmentRecord
from importer.domain.ledger import (
    ArchivedShipment, JournalEntry, LedgerMovement, LedgerPosition, LedgerShipment, MovementFilter, Position,
    ReceiptSource, StreamId, movements,
)

_MOVEMENT_COLUMNS = (
    "location", "batch_id", "line", "sku", "before", "quantity", "after", "owner", "applied_at_ms",
    "journal_ms", "journal_seq",
)


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


    # -- lists (History) -------------------------------------------------------

    def list_shipments(
        self, owner: str, *, locations: frozenset[str] | None, from_ms: int | None, to_ms: int | None,
        limit: int, after: Position | None,
    ) -> list[LedgerShipment]:
        where: list[str] = ["owner = %s"]
        args: list[Any] = [owner]
        _time_and_place(where, args, locations, from_ms, to_ms)
        if after is not None:
            where.append("(applied_at_ms, location, batch_id) < (%s, %s, %s)")
            args += [after[0], after[1], after[2]]
        with ledger_errors(), self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT location, batch_id, applied_at_ms, result, content_sha256 FROM ledger_shipments"
                f" WHERE {' AND '.join(where)} ORDER BY applied_at_ms DESC, location DESC, batch_id DESC LIMIT %s",
                [*args, limit],
            ).fetchall()
        return [LedgerShipment(str(r[0]), str(r[1]), int(r[2]), str(r[3]), str(r[4])) for r in rows]

    def list_movements(self, where: MovementFilter, *, limit: int, after: Position | None) -> list[LedgerMovement]:
        conditions: list[str] = []
        args: list[Any] = []
        if where.sku is not None or where.batch_id is not None:
            # The lines themselves, location first: by SKU (ledger_movements_by_sku) or
            # by batch (the primary key), at the locations asked or at every one the
            # ledger knows (no index leads with the SKU alone).
            source = "ledger_movements m"
            if where.locations is None:
                conditions.append("m.location IN (SELECT location FROM ledger_export_cursors)")
            rows_of = "m"
        else:
            # The shipments newest first (ledger_shipments_by_owner, _newest), then
            # their lines by primary key: the movements carry no time index.
            source = "ledger_shipments s JOIN ledger_movements m ON m.location = s.location AND m.batch_id = s.batch_id"
            rows_of = "s"
        if where.owner is not None:
            conditions.append(f"{rows_of}.owner = %s")
            args.append(where.owner)
        _time_and_place(conditions, args, where.locations, where.from_ms, where.to_ms, table=rows_of)
        if where.sku is not None:
            conditions.append("m.sku = %s")
            args.append(where.sku)
        if where.batch_id is not None:
            conditions.append("m.batch_id = %s")
            args.append(where.batch_id)
        if after is not None:
            conditions.append(f"{rows_of}.applied_at_ms <= %s")
            conditions.append(f"({rows_of}.applied_at_ms, {rows_of}.location, {rows_of}.batch_id, m.line) < (%s, %s, %s, %s)")
            args += [after[0], *after]
        sql = (
            "SELECT m.location, m.batch_id, m.line, m.sku, m.before, m.quantity, m.after, m.applied_at_ms, m.owner"
            f" FROM {source}" + (f" WHERE {' AND '.join(conditions)}" if conditions else "")
            + f" ORDER BY {rows_of}.applied_at_ms DESC, {rows_of}.location DESC, {rows_of}.batch_id DESC, m.line DESC"
        )
        with ledger_errors(), self.pool.connection() as conn:
            rows = conn.execute(sql + " LIMIT %s", [*args, limit]).fetchall()
        return [_movement(r) for r in rows]

    def stock_as_of(self, location: str, as_of_ms: int, *, limit: int, after_sku: str | None) -> list[tuple[str, int]]:
        with ledger_errors(), self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT DISTINCT ON (sku) sku, after FROM ledger_movements"
                " WHERE location = %s AND applied_at_ms < %s AND sku > %s"
                " ORDER BY sku, applied_at_ms DESC, batch_id DESC LIMIT %s",
                (location, as_of_ms, after_sku or "", limit),
            ).fetchall()
        return [(str(r[0]), int(r[1])) for r in rows]

    def sku_as_of(self, location: str, sku: str, as_of_ms: int) -> int | None:
        with ledger_errors(), self.pool.connection() as conn:
            row = conn.execute(
                "SELECT after FROM ledger_movements WHERE location = %s AND sku = %s AND applied_at_ms < %s"
                " ORDER BY applied_at_ms DESC, batch_id DESC LIMIT 1",
                (location, sku, as_of_ms),
            ).fetchone()
        return int(row[0]) if row else None


    # -- checks (importer ledger verify) ---------------------------------------

    def chain_breaks(self, location: str, limit: int = 50) -> list[tuple[str, str, int, int | None]]:
        """(sku, batchId, before, the previous movement's after (None: the SKU's first)) of each
        movement that does not start where the SKU's previous one ended (the first: at 0)."""
        with ledger_errors(), self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT sku, batch_id, before, previous FROM ("
                " SELECT sku, batch_id, before, lag(after) OVER (PARTITION BY sku ORDER BY journal_ms, journal_seq) AS previous"
                " FROM ledger_movements WHERE location = %s) AS chained"
                " WHERE before IS DISTINCT FROM coalesce(previous, 0) LIMIT %s",
                (location, limit),
            ).fetchall()
        return [(str(r[0]), str(r[1]), int(r[2]), None if r[3] is None else int(r[3])) for r in rows]

    def last_afters(self, location: str) -> dict[str, int]:
        """Each SKU's units after its last movement in the ledger."""
        with ledger_errors(), self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT DISTINCT ON (sku) sku, after FROM ledger_movements WHERE location = %s"
                " ORDER BY sku, journal_ms DESC, journal_seq DESC",
                (location,),
            ).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

def _time_and_place(
    where: list[str], args: list[Any], locations: frozenset[str] | None, from_ms: int | None, to_ms: int | None,
    table: str = "",
) -> None:
    t = f"{table}." if table else ""
    if locations is not None:
        where.append(f"{t}location = ANY(%s)")
        args.append(sorted(locations))
    if from_ms is not None:
        where.append(f"{t}applied_at_ms >= %s")
        args.append(from_ms)
    if to_ms is not None:
        where.append(f"{t}applied_at_ms < %s")
        args.append(to_ms)


def _movement(r: Any) -> LedgerMovement:
    return LedgerMovement(str(r[0]), str(r[1]), int(r[2]), str(r[3]), int(r[4]), int(r[5]), int(r[6]), int(r[7]), str(r[8]))

_COPY_LINES = 4096


def _text_array(values: list[str]) -> str:
    """A PostgreSQL text[] literal: every element quoted, backslash and quote escaped."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


def _int_array(values: list[int]) -> str:
    return "{" + ",".join(map(str, values)) + "}"


class PostgresExportClaim:
    """A location's cursor row, locked by this transaction (ExportClaim)."""

    def __init__(self, conn: psycopg.Connection, location: str, cursor: StreamId) -> None:
        self.conn = conn
        self.location = location
        self.cursor = cursor
        #: batchIds this claim met applied a second time (already held under another journal id).
        self.second_applications: list[str] = []

    def write(self, entries: list[JournalEntry], receipts: ReceiptSource) -> list[str]:
        # Idempotent by primary key: a shipment already in the ledger is left as it is.
        # One statement for the whole batch: unnest of one array per column, each array
        # sent as one text literal (psycopg's list dumper costs ~20 µs per entry here).
        rows = self.conn.execute(
            "INSERT INTO ledger_shipments (location, batch_id, owner, job_id, content_sha256, row_count, result,"
            " applied_at_ms, journal_ms, journal_seq, receipt)"
            " SELECT l, b, o, j, c, n, r, a, ms, seq, 'whole' FROM unnest("
            "%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::int[], %s::text[], %s::bigint[],"
            " %s::bigint[], %s::bigint[]) AS u(l, b, o, j, c, n, r, a, ms, seq)"
            " ON CONFLICT (location, batch_id) DO NOTHING RETURNING batch_id",
            [
                _text_array([e.location for e in entries]), _text_array([e.batch_id for e in entries]),
                _text_array([e.owner for e in entries]), _text_array([e.job_id for e in entries]),
                _text_array([e.content_sha256 for e in entries]), _int_array([e.rows for e in entries]),
                _text_array([e.result for e in entries]), _int_array([e.applied_at_ms for e in entries]),
                _int_array([e.stream_id[0] for e in entries]), _int_array([e.stream_id[1] for e in entries]),
            ],
        ).fetchall()
        inserted = {str(r[0]) for r in rows}
        missing: list[str] = []
        fresh = [e for e in entries if e.batch_id in inserted]
        if len(fresh) < len(entries):
            # Held already: the same entry written again after a crash (the same journal id), or a
            # second application of the batch (another journal id: Redis was behind the ledger).
            held = self.conn.execute(
                "SELECT batch_id, journal_ms, journal_seq FROM ledger_shipments WHERE location = %s AND batch_id = ANY(%s)",
                (self.location, [e.batch_id for e in entries if e.batch_id not in inserted]),
            ).fetchall()
            first = {str(r[0]): (int(r[1]), int(r[2])) for r in held}
            self.second_applications += [
                e.batch_id for e in entries if e.batch_id not in inserted and first.get(e.batch_id, e.stream_id) != e.stream_id
            ]
        if not fresh:
            return missing
        with self.conn.cursor() as cur:
            with cur.copy(f"COPY ledger_movements ({', '.join(_MOVEMENT_COLUMNS)}) FROM STDIN") as copy:
                # COPY's text format, written a few thousand lines at a time across entries
                # (a write per small entry costs a socket wait each): locations, batchIds,
                # SKUs and owners hold no tab, newline or backslash (their patterns), and
                # formatting the line here costs a fifth of write_row's per-value adaptation.
                lines: list[str] = []
                for entry in fresh:
                    chunks = receipts(entry)
                    if chunks is None:
                        missing.append(entry.batch_id)
                        continue
                    head = f"{entry.location}\t{entry.batch_id}\t"
                    tail = f"\t{entry.owner}\t{entry.applied_at_ms}\t{entry.stream_id[0]}\t{entry.stream_id[1]}\n"
                    for m in movements(chunks):
                        lines.append(f"{head}{m.line}\t{m.sku}\t{m.before}\t{m.quantity}\t{m.before + m.quantity}{tail}")
                        if len(lines) >= _COPY_LINES:
                            copy.write("".join(lines).encode())
                            lines = []
                if lines:
                    copy.write("".join(lines).encode())
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


class PostgresLedger(LedgerReads, LedgerSyncReads):
    """The Ledger port, plus the history reads of the API and the checks of the operator."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 8, connect_timeout: float = 5) -> None:
        self.url = url
        # Each connection is checked (an empty query) as it is handed out: a PostgreSQL
        # restarted meanwhile leaves pooled connections that only a use reveals dead,
        # and the pool replaces them instead of failing a read with them.
        self.pool = ConnectionPool(
            url, min_size=min_size, max_size=max_size, open=False, timeout=connect_timeout,
            kwargs={"autocommit": True, "connect_timeout": max(1, int(connect_timeout))},
            check=ConnectionPool.check_connection,
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

    def cursors(self) -> dict[str, tuple[StreamId, int]]:
        """Every location's cursor and how many entries it has committed."""
        with ledger_errors(), self.pool.connection() as conn:
            rows = conn.execute("SELECT location, journal_ms, journal_seq, shipments FROM ledger_export_cursors").fetchall()
        return {str(r[0]): ((int(r[1]), int(r[2])), int(r[3])) for r in rows}

    # -- the door --------------------------------------------------------------

    def archived(self, location: str, batch_ids: list[str]) -> dict[str, ArchivedShipment]:
        if not batch_ids:
            return {}
        with ledger_errors(), self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT batch_id, content_sha256, result, owner FROM ledger_shipments WHERE location = %s AND batch_id = ANY(%s)",
                (location, batch_ids),
            ).fetchall()
        return {str(r[0]): ArchivedShipment(str(r[1]), str(r[2]), str(r[3])) for r in rows}


class ProducerArchive:
    """[ledger] The door's question as a producer (submit_import) asks it: the ledger's
    own errors become the domain's LedgerUnreachable (503 ledger.unavailable)."""

    def __init__(self, ledger: PostgresLedger) -> None:
        self.ledger = ledger

    def archived(self, location: str, batch_ids: list[str]) -> dict[str, ArchivedShipment]:
        try:
            return self.ledger.archived(location, batch_ids)
        except LedgerUnavailable:
            raise LedgerUnreachable() from None
