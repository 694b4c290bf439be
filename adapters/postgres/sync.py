"""[ledger] The ledger's side of keeping Redis at or ahead of it
(adapters/processes/ledger_sync.py): how far the ledger has come per location,
what Redis lacks, and the shipments a restore writes back as done markers."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg.sql
from psycopg_pool import ConnectionPool

from importer.adapters.postgres.errors import ledger_errors
from importer.domain.ledger import LedgerPosition, StreamId


class LedgerSyncReads:
    """[ledger] Mixed into PostgresLedger."""

    pool: ConnectionPool

    def positions(self) -> dict[str, LedgerPosition]:
        """Per location: the cursor, the journal entries committed, and the last shipment
        in journal order (not always the one at the cursor: an entry the ledger met as a
        second application moves the cursor and writes no shipment)."""
        with ledger_errors(), self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT c.location, c.journal_ms, c.journal_seq, c.shipments, (SELECT s.batch_id FROM ledger_shipments s"
                " WHERE s.location = c.location ORDER BY s.journal_ms DESC, s.journal_seq DESC LIMIT 1)"
                " FROM ledger_export_cursors c"
            ).fetchall()
        return {str(r[0]): LedgerPosition(str(r[0]), (int(r[1]), int(r[2])), int(r[3]), str(r[4] or "")) for r in rows}

    def held_past(self, location: str, after: StreamId) -> tuple[int, int | None, int | None]:
        """(shipments whose journal id is past ``after``, the first one's and the last one's appliedAt ms)."""
        with ledger_errors(), self.pool.connection() as conn:
            row = conn.execute(
                "SELECT count(*), min(applied_at_ms), max(applied_at_ms) FROM ledger_shipments"
                " WHERE location = %s AND (journal_ms, journal_seq) > (%s, %s)",
                (location, after[0], after[1]),
            ).fetchone()
        assert row is not None
        return int(row[0]), (None if row[1] is None else int(row[1])), (None if row[2] is None else int(row[2]))

    def shipment_markers(self, location: str) -> Iterator[tuple[str, str, str, str, str, int]]:
        """Every shipment the ledger holds at a location, as its done marker held it:
        (batchId, owner, jobId, contentSha256, result, appliedAt ms), read with COPY."""
        with ledger_errors(), self.pool.connection() as conn:
            with conn.cursor() as cur:
                query = (
                    "COPY (SELECT batch_id, owner, job_id, content_sha256, result, applied_at_ms FROM ledger_shipments"
                    " WHERE location = {}) TO STDOUT"
                )
                with cur.copy(psycopg.sql.SQL(query).format(psycopg.sql.Literal(location))) as copy:
                    for row in copy.rows():
                        yield str(row[0]), str(row[1]), str(row[2]), str(row[3]), str(row[4]), int(row[5])

    def shipment_count(self, location: str) -> int:
        with ledger_errors(), self.pool.connection() as conn:
            row = conn.execute("SELECT count(*) FROM ledger_shipments WHERE location = %s", (location,)).fetchone()
        return int(row[0]) if row else 0

    def archived_batches(self, location: str, batch_ids: list[str]) -> dict[str, StreamId]:
        """Which of these batches the ledger holds at a location, with the journal id it was exported under."""
        if not batch_ids:
            return {}
        with ledger_errors(), self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT batch_id, journal_ms, journal_seq FROM ledger_shipments WHERE location = %s AND batch_id = ANY(%s)",
                (location, batch_ids),
            ).fetchall()
        return {str(r[0]): (int(r[1]), int(r[2])) for r in rows}
