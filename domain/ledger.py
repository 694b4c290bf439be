"""The ledger: every applied shipment and its stock movements, kept in a
database apart from the queue (PostgreSQL, adapters/postgres/).

The apply script writes, in the same atomic step as the stock, a journal
entry and a receipt for each applied shipment (adapters/redis/lua/apply.lua).
They are the *outbox*: the exporter copies them, location by location and
in journal order, into the ledger, each batch of entries in one transaction
that also moves the location's export cursor forward
(:func:`export_location`). Once the ledger holds an entry, Redis may drop it
after the hot window (the receipt and the journal entry), and its done
marker after the idempotency horizon (adapters/redis/outbox.py). What a done
marker meant for the stock count is then answered by the ledger: a batch is
never applied twice, however old (docs/reliability.md, "The ledger").

Nothing here does I/O: the ports are below, the adapters implement them.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from importer.domain.jobs import ShipmentRecord
from importer.domain.receipt import STORED_LINE, whole_lines
from importer.domain.shipment import SKU_PATTERN

#: A Redis stream id as two integers (milliseconds, sequence): compared as
#: numbers, never as the string "ms-seq" (where "9-0" > "10-0").
StreamId = tuple[int, int]

ZERO: StreamId = (0, 0)


_SKU = re.compile(SKU_PATTERN)


def is_valid_sku(value: object) -> bool:
    """A SKU as the CSV rules have it (a filter of the history reads)."""
    return isinstance(value, str) and _SKU.fullmatch(value) is not None


def parse_stream_id(text: str) -> StreamId:
    """'1733300000000-3' -> (1733300000000, 3); ValueError on anything else."""
    ms, sep, seq = text.partition("-")
    if not sep or not ms.isdigit() or not seq.isdigit():
        raise ValueError(f"not a stream id: {text!r}")
    return int(ms), int(seq)


def format_stream_id(stream_id: StreamId) -> str:
    return f"{stream_id[0]}-{stream_id[1]}"


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One applied shipment as its journal entry in Redis tells it."""

    location: str
    stream_id: StreamId
    batch_id: str
    job_id: str
    owner: str
    content_sha256: str
    applied_at_ms: int
    #: The stored result JSON, as the done marker holds it ({"imported": n, "batchId": ...}).
    result: str

    @property
    def rows(self) -> int:
        try:
            value = json.loads(self.result).get("imported", 0)
        except (ValueError, AttributeError):
            return 0
        return int(value) if isinstance(value, int) else 0


@dataclass(frozen=True, slots=True)
class Movement:
    """One line of an applied shipment: line number (1 = the file's first row), SKU, stock before, quantity."""

    line: int
    sku: str
    before: int
    quantity: int

    @property
    def after(self) -> int:
        return self.before + self.quantity


def movements(chunks: Iterable[bytes]) -> Iterator[Movement]:
    """The movements of a stored receipt read in pieces of any size (adapters
    read a large one in ranges: memory stays bounded). ValueError on a line
    that is not ``sku,before,quantity``."""
    line = 0
    for piece in whole_lines(chunks):
        end = 0
        for match in STORED_LINE.finditer(piece):
            if match.start() != end:
                raise ValueError("not a stored receipt: a line is not 'sku,before,quantity'")
            end = match.end()
            line += 1
            yield Movement(line, match.group(1).decode(), int(match.group(2)), int(match.group(3)))
        if end != len(piece):
            raise ValueError("not a stored receipt: a line is not 'sku,before,quantity'")


@dataclass(frozen=True, slots=True)
class ArchivedShipment:
    """What the ledger vouches for a batch whose done marker may have left Redis."""

    content_sha256: str
    result: str
    owner: str = ""


# -- ports ------------------------------------------------------------------


class ReceiptSource(Protocol):
    def __call__(self, entry: JournalEntry) -> Iterable[bytes] | None:
        """The entry's stored receipt in pieces, or None when it is gone (an operator deleted it)."""
        ...


class LedgerOutbox(Protocol):
    """The Redis side: the journal and receipts of one location, read in order."""

    def read_journal(self, location: str, after: StreamId, count: int) -> list[JournalEntry]: ...
    def receipt_source(self, location: str, entries: list[JournalEntry] | None = ...) -> ReceiptSource: ...
    def journal_head(self, location: str) -> tuple[StreamId, int]:
        """The last entry's id (ZERO when empty) and the journal's length."""
        ...


class ExportClaim(Protocol):
    """One location's export cursor, held by this exporter until the transaction ends."""

    cursor: StreamId
    #: The batchIds :meth:`write` found held already under another journal id: applied a
    #: second time in Redis (it was behind the ledger). Never written twice; an alarm.
    second_applications: list[str]

    def write(self, entries: list[JournalEntry], receipts: ReceiptSource) -> list[str]:
        """Write the shipments not yet in the ledger, with their movements;
        returns the batchIds whose receipt was missing."""
        ...

    def advance(self, to: StreamId, shipments: int) -> None: ...


class ArchiveLookup(Protocol):
    """The door's question: which of these batches does the ledger hold at a location?"""

    def archived(self, location: str, batch_ids: list[str]) -> dict[str, ArchivedShipment]: ...


class ShipmentHistory(Protocol):
    """The history reads the API falls back on once Redis dropped a shipment's marker or receipt.
    A ledger that does not answer raises :class:`~importer.domain.errors.LedgerUnreachable`."""

    def shipment(self, location: str, batch_id: str) -> tuple[ShipmentRecord, bool] | None:
        """The archived done marker, and whether its receipt is whole (False: deleted before the export)."""
        ...

    def stored_receipt(self, location: str, batch_id: str) -> bytes: ...


@dataclass(frozen=True, slots=True)
class LedgerShipment:
    """One applied shipment as the ledger lists it."""

    location: str
    batch_id: str
    applied_at_ms: int
    result: str
    content_sha256: str


@dataclass(frozen=True, slots=True)
class LedgerMovement:
    """One line of an applied shipment as the ledger lists it."""

    location: str
    batch_id: str
    line: int
    sku: str
    before: int
    quantity: int
    after: int
    applied_at_ms: int
    owner: str


#: A position in a newest-first list: (applied_at_ms, location, batchId, line).
Position = tuple[int, str, str, int]


@dataclass(frozen=True)
class MovementFilter:
    """What GET /api/stock-movements asks for. ``owner`` None: every owner's (a stock reader)."""

    owner: str | None
    locations: frozenset[str] | None = None
    sku: str | None = None
    batch_id: str | None = None
    from_ms: int | None = None
    to_ms: int | None = None


class History(Protocol):
    """The ledger's lists and stock as of a time (GET /api/shipments, /api/stock-movements, /api/stock)."""

    def list_shipments(
        self, owner: str, *, locations: frozenset[str] | None, from_ms: int | None, to_ms: int | None,
        limit: int, after: Position | None,
    ) -> list[LedgerShipment]: ...

    def list_movements(self, where: MovementFilter, *, limit: int, after: Position | None) -> list[LedgerMovement]:
        """Newest first, at most ``limit``, those after ``after`` (a page's last position)."""
        ...

    def stock_as_of(self, location: str, as_of_ms: int, *, limit: int, after_sku: str | None) -> list[tuple[str, int]]:
        """(sku, units) after every shipment applied before ``as_of_ms``, by SKU."""
        ...

    def sku_as_of(self, location: str, sku: str, as_of_ms: int) -> int | None: ...


class Ledger(Protocol):
    """The database side (adapters/postgres/ledger.py)."""

    def claim(self, location: str) -> AbstractContextManager[ExportClaim | None]:
        """The location's cursor, locked for one transaction that commits on a
        normal exit; None when another exporter holds it (skip the location)."""
        ...

    def cursor(self, location: str) -> StreamId: ...

    def archived(self, location: str, batch_ids: list[str]) -> dict[str, ArchivedShipment]: ...


class EventLog(Protocol):
    def __call__(self, event: str, level: int = ..., **fields: object) -> None: ...


@dataclass(frozen=True)
class ExportLag:
    """How far the ledger is behind one location's journal: entries applied and not yet
    committed in the ledger, and the age of the oldest of them (0 when none)."""

    location: str
    entries: int
    seconds: float


def export_lag(location: str, *, appended: int, exported: int, oldest_pending_ms: int | None, now_ms: int) -> ExportLag:
    """``appended``: entries the journal ever received; ``exported``: those the ledger committed."""
    pending = max(0, appended - exported)
    age = 0.0 if not pending or oldest_pending_ms is None else max(0.0, (now_ms - oldest_pending_ms) / 1000)
    return ExportLag(location, pending, age)


@dataclass(frozen=True)
class ExportReport:
    location: str
    #: Entries this call committed (0: nothing new, or the location was held elsewhere).
    exported: int
    #: The cursor once this call ended (the committed one).
    cursor: StreamId
    held_elsewhere: bool = False


def export_location(outbox: LedgerOutbox, ledger: Ledger, location: str, *, max_entries: int, log: EventLog) -> ExportReport:
    """Copy the next journal entries of ``location`` (at most ``max_entries``)
    into the ledger, in one transaction that moves the location's cursor past
    them. A crash anywhere leaves the cursor where the last commit put it: the
    next call writes the same entries again, and nothing twice (the rows and
    the cursor commit together; the claim's row lock keeps a second exporter out)."""
    with ledger.claim(location) as claim:
        if claim is None:
            return ExportReport(location, 0, ZERO, held_elsewhere=True)
        entries = outbox.read_journal(location, after=claim.cursor, count=max_entries)
        if not entries:
            return ExportReport(location, 0, claim.cursor)
        missing = claim.write(entries, outbox.receipt_source(location, entries))
        for batch_id in missing:
            log("ledger.receipt_missing", logging.WARNING, location=location, batchId=batch_id)
        for batch_id in claim.second_applications:
            log("ledger.second_application", logging.ERROR, location=location, batchId=batch_id,
                hint="the ledger holds this batch under another journal entry: Redis applied it twice (it was behind "
                     "the ledger); the ledger keeps the first, `importer ledger restore` brings Redis's stock back")
        claim.advance(entries[-1].stream_id, len(entries))
        committed = entries[-1].stream_id
    return ExportReport(location, len(entries), committed)


# -- Redis behind the ledger (restored from a backup, emptied, a lagging replica promoted) --

@dataclass(frozen=True, slots=True)
class LedgerPosition:
    """How far the ledger has come at one location: the journal id of the last entry it
    committed, how many journal entries it committed (each an apply in Redis), and the
    batch it holds last in journal order."""

    location: str
    cursor: StreamId
    shipments: int
    last_batch_id: str


@dataclass(frozen=True, slots=True)
class RedisPosition:
    """How far Redis has come at one location: its journal's last id (ZERO: no journal),
    whether it has a trace (a done marker, or the filter of pruned ones) of the ledger's
    last batch, and how many applies it counted there (its generation)."""

    journal_last: StreamId
    knows_last_batch: bool
    applies: int = 0


@dataclass(frozen=True, slots=True)
class Behind:
    """A location whose Redis lacks shipments the ledger holds: how many, and how much
    applying time they span (from the first one Redis lacks to the ledger's last)."""

    location: str
    shipments: int
    seconds: float
    reason: str


def is_behind(ledger: LedgerPosition, redis: RedisPosition) -> bool:
    """Whether Redis lacks a shipment the ledger holds. Redis *ahead* of the ledger (the
    export lag: applied, not yet exported) never is: its journal is at or past the
    ledger's cursor, it holds the marker of every batch it applied, and it counted at
    least as many applies as the ledger committed journal entries. Each test alone can
    miss a case: a Redis restored from an older snapshot whose journal then took a new
    entry is past the cursor by time, yet lacks the last batch's marker; one that then
    applied again the last batch (a job waiting in the snapshot) has its marker, yet
    counted fewer applies than the ledger holds."""
    if ledger.shipments == 0:
        return False
    return redis.journal_last < ledger.cursor or not redis.knows_last_batch or redis.applies < ledger.shipments


def restored_stock(
    ledger_afters: dict[str, int], current: Iterable[str], fresh: list[tuple[str, list[tuple[str, int]]]],
) -> tuple[dict[str, int], list[str], dict[str, list[tuple[str, int, int]]]]:
    """The stock a location's Redis is brought forward to: each SKU as the ledger's
    movements end, plus what the shipments Redis applied since and the ledger does not hold
    yet (``fresh``: batchId and (sku, quantity) lines, in journal order) added on top.

    Returns (stock per SKU, the SKUs Redis holds that end at none: to delete, and per fresh
    batch its receipt lines (sku, before, quantity) computed on the restored stock, so that
    the ledger's movements chain once they are exported)."""
    stock = dict(ledger_afters)
    receipts: dict[str, list[tuple[str, int, int]]] = {}
    for batch_id, lines in fresh:
        rows = []
        for sku, quantity in lines:
            before = stock.get(sku, 0)
            rows.append((sku, before, quantity))
            stock[sku] = before + quantity
        receipts[batch_id] = rows
    gone = sorted(set(current) - set(stock))
    return stock, gone, receipts
