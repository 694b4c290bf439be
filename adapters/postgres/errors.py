"""[ledger] PostgreSQL's errors as the ledger's: unreachable (503) or refusing a value (422)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg_pool import PoolTimeout

from importer.domain.errors import DomainError, LedgerUnreachable


class LedgerUnavailable(LedgerUnreachable):
    """PostgreSQL did not answer (down, refusing, read-only, timed out): ``503
    ledger.unavailable``; the message stays in logs."""


class LedgerRefusedInput(DomainError):
    """PostgreSQL refused a value it was given (a NUL byte, a number out of its range):
    the request's fault, ``422 request.invalid``. The handlers check every value
    before a query is made, so this is their safety net, never a ``500`` or a ``503``."""

    code = "request.invalid"


@contextmanager
def ledger_errors() -> Iterator[None]:
    try:
        yield
    # UndefinedTable: the schema is not migrated yet (the exporter, or a process's start, migrates it).
    except (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.UndefinedTable, PoolTimeout) as exc:
        raise LedgerUnavailable(f"{type(exc).__name__}: {exc}") from exc
    except psycopg.DataError as exc:
        raise LedgerRefusedInput(f"{type(exc).__name__}: {exc}") from exc
