"""[ledger] Redis behind the ledger: found, marked, brought forward.

PostgreSQL is the record; Redis decides what is applied. When Redis comes
back *behind* the ledger (restored from an older backup, emptied, a replica
promoted before it had the last writes), it lacks shipments the ledger holds:
their stock, and the done markers that make a repeat a replay.

**Found.** :meth:`LedgerSync.check` compares, per location, the ledger's
position (the journal id of the last entry it committed, and that entry's
batch) with Redis's (its journal's last generated id, and a trace of that
batch: its done marker or the filter of pruned ones): domain/ledger.py
is_behind. Redis *ahead* (the export lag) never trips it. Every process that
has the ledger runs it when it starts and every second after
(:class:`SyncWatch`); the exporter before each pass.

**Marked.** A location found behind gets ``P:ledger:behind`` in Redis: while
it exists, intake there answers ``503 store.behind_ledger``, workers do not
apply there (the attempt is an outage: retried, never counted), the exporter
does not export there, and /health, doctor, /metrics and the operators' page
say so. One log line (``ledger.redis_behind``) says how far behind.

**Brought forward** (:meth:`LedgerSync.restore`, under a lock; the exporter
runs it by itself, ``importer ledger restore`` by hand): a done marker for
every batch the ledger holds that Redis lacks; each SKU's stock as the
ledger's movements end, plus the shipments Redis applied since the ledger's
cursor (their receipts recomputed on that stock, so the ledger's movements
chain); a second application of a batch the ledger holds (applied in the
moment before the mark) undone and its journal entry dropped; the journal
numbered past the ledger's cursor; then the mark deleted. Every write sets a
value the ledger decides: killed anywhere, run again, same end state.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from importer.adapters.logs import log_event
from importer.adapters.postgres.errors import LedgerUnavailable
from importer.adapters.postgres.ledger import PostgresLedger
from importer.adapters.redis.errors import StoreUnavailable
from importer.adapters.redis.store import RedisStore
from importer.domain.ledger import Behind, JournalEntry, is_behind, movements, restored_stock

log = logging.getLogger("importer.ledger")

#: Seconds between two checks of a process's SyncWatch.
CHECK_EVERY_S = 1.0
#: Milliseconds start.lua's gate stays open after a renewal (renewed every CHECK_EVERY_S by two
#: threads of each process): a snapshot restored, or a replica promoted, more than this after
#: the last renewal it holds is closed from its first command.
GATE_TTL_MS = 2000
#: Seconds the restore's lock lives unless renewed (it is, every chunk of markers).
RESTORE_LOCK_S = 60
#: Markers read from the ledger and written to Redis per chunk.
MARKER_CHUNK = 5000


@dataclass
class RestoreReport:
    location: str
    ledger_shipments: int = 0
    markers_written: int = 0
    skus: int = 0
    skus_changed: int = 0
    fresh: int = 0
    second_applications: list[str] = field(default_factory=list)
    held_elsewhere: bool = False
    dry_run: bool = False

    def line(self) -> str:
        if self.held_elsewhere:
            return f"{self.location}: another restore holds the lock; nothing done"
        verb = "would write" if self.dry_run else "wrote"
        return (f"{self.location}: the ledger holds {self.ledger_shipments} shipment(s); {verb} {self.markers_written} "
                f"done marker(s), {self.skus_changed} of {self.skus} SKU(s)' stock, {self.fresh} shipment(s) applied "
                f"since the ledger's cursor kept, {len(self.second_applications)} second application(s) undone"
                + (f" ({', '.join(self.second_applications[:10])})" if self.second_applications else ""))


class LedgerSync:
    """The check and the restore, for one store and one ledger."""

    def __init__(self, store: RedisStore, ledger: PostgresLedger, *, marker_chunk: int = MARKER_CHUNK,
                 fault: Callable[[str], None] = lambda point: None) -> None:
        self.store = store
        self.ledger = ledger
        self.marker_chunk = marker_chunk
        #: Test-only points (IMPORTER_FAULT, adapters/faults.py): restore_markers (after each chunk),
        #: restore_stock (stock written), restore_clear (all written, the mark not yet deleted).
        self.fault = fault

    def check(self) -> dict[str, Behind]:
        """The locations whose Redis is behind the ledger (PostgreSQL and Redis both asked)."""
        found: dict[str, Behind] = {}
        for location, position in self.ledger.positions().items():
            redis_position = self.store.redis_position(location, position.last_batch_id)
            if not is_behind(position, redis_position):
                continue
            lacking, first_ms, last_ms = self.ledger.held_past(location, redis_position.journal_last)
            reason = ("journal_behind_ledger" if redis_position.journal_last < position.cursor
                      else "last_shipment_unknown" if not redis_position.knows_last_batch else "fewer_applies_than_ledger")
            found[location] = Behind(
                location, max(1, lacking, position.shipments - redis_position.applies),
                ((last_ms - first_ms) / 1000) if first_ms and last_ms else 0.0, reason,
            )
        return found

    def check_and_renew(self) -> dict[str, Behind]:
        """:meth:`check`, :meth:`mark` what is behind, and renew start.lua's gate where the
        location is neither found nor marked behind. The ledger away: the gates are renewed
        only where the server is the one last verified (ledger_verified.lua), the marks stay."""
        locations = self.store.locations()
        try:
            behind = self.check()
        except LedgerUnavailable:
            for location in locations:
                self.store.renew_gate(location, verified=False, ttl_ms=GATE_TTL_MS)
            raise
        self.mark(behind)
        marked = self.store.behind_marks(locations)
        for location in locations:
            if location not in behind and location not in marked:
                self.store.renew_gate(location, verified=True, ttl_ms=GATE_TTL_MS)
        return behind

    def mark(self, behind: dict[str, Behind]) -> None:
        """Mark each location found behind; the first mark logs how far behind."""
        now = self.store.server_time_ms()
        for b in behind.values():
            if self.store.mark_behind(b, now):
                log_event(log, "ledger.redis_behind", logging.ERROR, location=b.location, shipments=b.shipments,
                          seconds=round(b.seconds, 3), reason=b.reason,
                          hint="intake and applies wait there until it is brought forward (importer ledger restore)")

    def restore(self, location: str, *, dry_run: bool = False) -> RestoreReport:
        """Bring a location's Redis forward from the ledger (module docstring)."""
        report = RestoreReport(location, dry_run=dry_run)
        token = uuid.uuid4().hex
        if not dry_run and not self.store.take_restore_lock(location, token, RESTORE_LOCK_S):
            report.held_elsewhere = True
            return report
        try:
            self._restore(location, report, token)
        finally:
            if not dry_run:
                self.store.drop_restore_lock(location, token)
        return report

    def _restore(self, location: str, report: RestoreReport, token: str) -> None:
        dry = report.dry_run
        position = self.ledger.positions().get(location)
        if position is None:
            return
        report.ledger_shipments = self.ledger.shipment_count(location)
        if not dry:  # marked first: nothing is taken there while it runs, also after a kill
            self.store.mark_behind(Behind(location, position.shipments, 0.0, "restoring"), self.store.server_time_ms())
        chunk: list[tuple[str, str, str, str, str, int]] = []
        for marker in self.ledger.shipment_markers(location):
            chunk.append(marker)
            if len(chunk) == self.marker_chunk:
                report.markers_written += self._markers(location, chunk, dry, token)
                chunk = []
                if not dry:
                    self.fault("restore_markers")
        report.markers_written += self._markers(location, chunk, dry, token)

        # What Redis applied past the ledger's cursor: new shipments to keep, and second
        # applications of batches the ledger holds (under another journal entry) to undo.
        entries: list[JournalEntry] = []
        while batch := self.store.read_journal(location, entries[-1].stream_id if entries else position.cursor, 500):
            entries += batch
        held = self.ledger.archived_batches(location, [e.batch_id for e in entries])
        second = [e for e in entries if e.batch_id in held and held[e.batch_id] != e.stream_id]
        fresh_entries = [e for e in entries if e.batch_id not in held]
        source = self.store.receipt_source(location, fresh_entries)
        fresh = []
        for entry in fresh_entries:
            chunks = source(entry)
            fresh.append((entry.batch_id, [(m.sku, m.quantity) for m in movements(chunks)] if chunks is not None else []))
        afters = self.ledger.last_afters(location)
        now = self.store.stock_all(location)
        stock, gone, receipts = restored_stock(afters, now, fresh)
        report.skus = len(stock)
        report.skus_changed = sum(1 for sku, units in stock.items() if now.get(sku) != units) + len(gone)
        report.fresh = len(fresh)
        report.second_applications = [e.batch_id for e in second]
        if dry:
            return
        self.store.restore_stock(location, stock, gone, applies=position.shipments + len(fresh))
        self.fault("restore_stock")
        self.store.rewrite_receipts(location, {b: r for b, r in receipts.items() if r})
        self.store.drop_journal_entries(location, [e.stream_id for e in second])
        self.store.raise_journal_floor(location, position.cursor)
        # An emptied Redis lost the registry of declared locations too: the ledger's are declared again.
        self.store.declare_locations([location])
        self.fault("restore_clear")
        self.store.clear_behind(location)
        self.store.renew_gate(location, verified=True, ttl_ms=GATE_TTL_MS)
        log_event(log, "ledger.restored", logging.WARNING, location=location, detail=report.line())

    def _markers(self, location: str, chunk: list[tuple[str, str, str, str, str, int]], dry: bool, token: str) -> int:
        if not chunk:
            return 0
        if dry:
            return self.store.missing_markers(location, [m[0] for m in chunk])
        if not self.store.take_restore_lock(location, token, RESTORE_LOCK_S):
            raise StoreUnavailable(f"the restore's lock at {location} was lost", "restore_lock_lost")
        return self.store.restore_markers(location, chunk)


class SyncWatch:
    """A process's view of which locations are behind the ledger: its own check (when it
    has the ledger) and every process's marks, refreshed every ``every_s`` by a daemon
    thread; :meth:`is_behind` only reads the last view (a POST or an attempt never waits
    on PostgreSQL). Started before the worker consumes (its boot), or by the first
    question, in the process that asks (after any fork).
    Each check renews start.lua's gate where the location is not behind: the gate, not
    this view, is what keeps a restored Redis from applying before it is checked."""

    def __init__(self, store: RedisStore, ledger: PostgresLedger | None, every_s: float = CHECK_EVERY_S) -> None:
        self.store = store
        self.sync = LedgerSync(store, ledger) if ledger is not None else None
        self.every_s = every_s
        self.marks: dict[str, dict[str, str]] = {}
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._checked = threading.Event()

    def is_behind(self, location: str) -> bool:
        if self._thread is None:
            self.start()
        return location in self.marks

    def refresh(self, *, check: bool = True) -> None:
        if check and self.sync is not None:
            try:
                self.sync.check_and_renew()
            except (LedgerUnavailable, StoreUnavailable):
                pass  # the ledger or Redis away: the marks already made still hold
            finally:
                self._checked.set()
        try:
            self.marks = self.store.behind_marks(self.store.locations())
        except StoreUnavailable:
            pass

    def renew_steady(self) -> None:
        """Renew start.lua's gate where no mark says behind, on the server last verified only
        (ledger_verified.lua 'steady'): Redis alone, so that a ledger that hangs (a stopped
        PostgreSQL holds a query with no bound) stops no import on a Redis it verified."""
        try:
            for location in self.store.locations():
                if location not in self.marks:
                    self.store.renew_gate(location, verified=False, ttl_ms=GATE_TTL_MS)
        except StoreUnavailable:
            pass

    def start(self, wait_s: float = 0.0) -> None:
        """Read the marks now (Redis only), then check and renew in two threads (idempotent);
        with ``wait_s``, wait that long at most for the first check (a worker, before it
        consumes). A POST or /health never waits on PostgreSQL. Until the first check,
        start.lua's gate holds attempts wherever it was not renewed lately."""
        with self._start_lock:
            if self._thread is None:
                self.refresh(check=False)
                self._thread = threading.Thread(target=self._loop, args=(self.refresh,), name="ledger-sync", daemon=True)
                self._thread.start()
                threading.Thread(target=self._loop, args=(self.renew_steady,), name="ledger-gate", daemon=True).start()
        self._checked.wait(wait_s)

    def _loop(self, work: Callable[[], None]) -> None:
        while True:
            try:
                work()
            except Exception:  # never let the watch die: the next round tries again
                log.exception("ledger sync watch failed")
            time.sleep(self.every_s)
