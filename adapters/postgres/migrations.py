"""The ledger's schema, versioned: the numbered SQL files beside this module
(migrations/NNNN_name.sql), applied in order at start-up under an advisory
lock, so that processes starting together apply each once."""

from __future__ import annotations

import re
from importlib import resources

import psycopg

#: pg_advisory_lock key of the migration step ("importer" in ASCII, as a bigint).
MIGRATION_LOCK = 0x696D706F72746572

_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def migrations() -> list[tuple[int, str, str]]:
    """(version, file name, SQL) of every migration, in order."""
    folder = resources.files("importer.adapters.postgres") / "migrations"
    found = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    return sorted(found)


def latest_version() -> int:
    return migrations()[-1][0]


def applied_version(conn: psycopg.Connection) -> int:
    """The schema version the database holds (0: none)."""
    exists = conn.execute("SELECT to_regclass('ledger_schema_versions') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM ledger_schema_versions").fetchone()
    return int(row[0]) if row else 0


def migrate(conn: psycopg.Connection) -> list[str]:
    """Apply every migration the database lacks; returns the files applied.
    ``conn`` must be in autocommit mode (each migration is its own transaction)."""
    done: list[str] = []
    conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS ledger_schema_versions ("
            " version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        current = applied_version(conn)
        for version, name, sql in migrations():
            if version <= current:
                continue
            with conn.transaction():
                conn.execute(sql.encode())
                conn.execute("INSERT INTO ledger_schema_versions (version, name) VALUES (%s, %s)", (version, name))
            done.append(name)
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
    return done
