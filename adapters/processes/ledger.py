"""``importer ledger``: the exporter. It copies every applied shipment from
Redis's outbox (journal and receipts) into the ledger in PostgreSQL, exactly
once, location by location (domain/ledger.py export_location), then trims
from Redis what the ledger holds: receipts and journal entries past the hot
window, done markers past the idempotency horizon (adapters/redis/outbox.py).

Why a process of its own: the export's cost (a PostgreSQL transaction per
batch of entries) never sits on an import's path, an outage of PostgreSQL
only makes it wait (the lag grows, imports go on), and any number of them
can run: each location's cursor row is locked by one at a time (FOR UPDATE
SKIP LOCKED), the others skip it. ``importer dev`` starts one.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from importer.adapters.logs import log_event
from importer.adapters.postgres.errors import LedgerUnavailable
from importer.adapters.postgres.ledger import PostgresLedger
from importer.adapters.processes.ledger_sync import LedgerSync
from importer.adapters.redis.errors import StoreUnavailable
from importer.adapters.redis.store import RedisStore
from importer.adapters.settings import Settings
from importer.adapters.redis.records import text_of
from importer.domain.ledger import ZERO, ExportLag, export_lag, export_location, movements

log = logging.getLogger("importer.ledger")


def _log(event: str, level: int = logging.INFO, **fields: object) -> None:
    log_event(log, event, level, **fields)


@dataclass
class Exporter:
    """One exporter: :meth:`pass_once` over every location, :meth:`run` until stopped."""

    store: RedisStore
    ledger: PostgresLedger
    settings: Settings
    exported: int = 0
    failures: int = field(default=0)
    #: [ledger] when this exporter last checked that Redis is not behind the ledger (monotonic s)
    checked_at: float = field(default=0.0)

    def behind(self) -> set[str]:
        """The locations whose Redis is behind the ledger: checked (at most once a second) and
        marked, then, with IMPORTER_LEDGER_AUTO_RESTORE, brought forward (ledger_sync.py).
        Nothing is exported where a mark remains."""
        sync = LedgerSync(self.store, self.ledger)
        found: set[str] = set()
        if time.monotonic() - self.checked_at >= 1.0:
            found = set(sync.check_and_renew())
            self.checked_at = time.monotonic()
        # with the ledger's own locations found behind: an emptied Redis lost its registry of locations too
        marked = set(self.store.behind_marks(set(self.store.locations()) | found))
        if self.settings.ledger_auto_restore:
            for location in sorted(marked):
                report = sync.restore(location)
                if not report.held_elsewhere:
                    marked.discard(location)
        return marked

    def pass_once(self) -> int:
        """One pass over every location: export what is new (up to ledger_batch
        entries per location per transaction, until caught up), then trim.
        Returns the entries this pass committed."""
        s = self.settings
        total = 0
        behind = self.behind()
        now = self.store.server_time_ms()
        for location in self.store.locations():
            if location in behind:
                continue
            while True:
                report = export_location(self.store, self.ledger, location, max_entries=s.ledger_batch, log=_log)
                total += report.exported
                if report.exported:
                    _log("ledger.exported", logging.DEBUG if report.exported > 1 else logging.INFO,
                         location=location, entries=report.exported, cursor=f"{report.cursor[0]}-{report.cursor[1]}")
                if report.exported < s.ledger_batch:
                    break
            if report.held_elsewhere:
                continue
            # The cursor this exporter's last transaction committed (or found, with nothing new).
            while self.store.trim_exported(location, report.cursor, now - int(s.ledger_hot_window_s * 1000)) > 0:
                pass
            recheck = max(1000, int(min(s.idempotency_horizon_s, 3600) * 1000))
            while self.store.prune_markers(location, now - int(s.idempotency_horizon_s * 1000), recheck_ms=recheck) > 0:
                pass
        self.exported += total
        return total

    def run(self, stop: threading.Event) -> int:
        backoff = self.settings.ledger_interval_s
        while not stop.is_set():
            try:
                self.pass_once()
                if self.failures:
                    _log("ledger.recovered", after_failures=self.failures)
                self.failures = 0
                backoff = self.settings.ledger_interval_s
            except (LedgerUnavailable, StoreUnavailable) as exc:
                self.failures += 1
                if self.failures == 1 or self.failures % 50 == 0:
                    _log("ledger.unavailable", logging.WARNING, detail=str(exc)[:300], failures=self.failures)
                backoff = min(5.0, max(backoff * 2, 0.2))
            # A pass exports until caught up, then waits the interval: the entries that
            # arrive meanwhile go in one transaction, not one pass each (that cost 3× the CPU).
            stop.wait(backoff)
        return 0


def build_exporter(settings: Settings) -> Exporter:
    from importer.adapters.bootstrap import clock_ms, redis_client

    if not settings.database_url:
        from importer.adapters.settings import SettingsError

        raise SettingsError("IMPORTER_DATABASE_URL is not set (the ledger's PostgreSQL; `importer dev` starts one)")
    ledger = PostgresLedger(settings.database_url, max_size=2).open(wait=False)
    return Exporter(RedisStore(redis_client(settings), settings, clock_ms=clock_ms), ledger, settings)


def migrate_when_ready(ledger: PostgresLedger, stop: threading.Event, interval_s: float = 1.0) -> bool:
    """Apply the schema's migrations once PostgreSQL answers (False: stopped first)."""
    failures = 0
    while not stop.is_set():
        try:
            applied = ledger.migrate()
            if applied:
                _log("ledger.migrated", applied=",".join(applied))
            return True
        except LedgerUnavailable as exc:
            failures += 1
            if failures == 1 or failures % 30 == 0:
                _log("ledger.unavailable", logging.WARNING, detail=str(exc)[:300], failures=failures)
            stop.wait(interval_s)
    return False


def export_lags(store: RedisStore, ledger: PostgresLedger, locations: list[str] | None = None) -> list[ExportLag]:
    """Per location, how far the ledger is behind its journal (/metrics, importer doctor)."""
    cursors = ledger.cursors()
    now = store.server_time_ms()
    lags = []
    for location in locations or store.locations():
        cursor, exported = cursors.get(location, (ZERO, 0))
        appended, oldest = store.journal_progress(location, cursor)
        lags.append(export_lag(location, appended=appended, exported=exported, oldest_pending_ms=oldest, now_ms=now))
    return lags


class LedgerStatus:
    """[ledger] /health's view of the ledger: up, and the export lag summed over the
    locations. A daemon thread refreshes it every ``every_s``; a probe only reads the
    last view, so /health never waits on PostgreSQL (a stopped server holds a query
    with no bound). A view not refreshed for ``stale_s`` (the refresh is stuck) is
    reported as down."""

    def __init__(self, store: RedisStore, ledger: PostgresLedger, every_s: float = 1.0, stale_s: float = 2.5,
                 on_start: Callable[[], None] | None = None) -> None:
        self.on_start = on_start
        self.store = store
        self.ledger = ledger
        self.every_s = every_s
        self.stale_s = stale_s
        self._at = time.monotonic()
        self._last: dict[str, Any] = {"up": False, "lagEntries": None, "lagSeconds": None}
        self._per_location: dict[str, dict[str, Any]] = {}
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def _refresh(self) -> None:
        while True:
            try:
                lags = export_lags(self.store, self.ledger)
                view: dict[str, Any] = {"up": True, "lagEntries": sum(lag.entries for lag in lags),
                                        "lagSeconds": round(max((lag.seconds for lag in lags), default=0.0), 3)}
                marks = self.store.behind_marks(self.store.locations())
                if marks:  # [ledger] Redis behind the ledger there (ledger_sync.py)
                    view["behind"] = [{"location": loc, "shipments": int(m.get("shipments") or 0),
                                       "seconds": float(m.get("seconds") or 0), "reason": m.get("reason", "")}
                                      for loc, m in sorted(marks.items())]
                per = {lag.location: {"lagEntries": lag.entries, "lagSeconds": round(lag.seconds, 3),
                                      "behindShipments": int(marks.get(lag.location, {}).get("shipments") or 0)}
                       for lag in lags}
            except Exception:  # the ledger or Redis away: down, said as such
                view, per = {"up": False, "lagEntries": None, "lagSeconds": None}, {}
            self._last, self._per_location, self._at = view, per, time.monotonic()
            time.sleep(self.every_s)

    def __call__(self) -> dict[str, Any]:
        self._start()
        if time.monotonic() - self._at > self.stale_s:
            return {"up": False, "lagEntries": None, "lagSeconds": None}
        return dict(self._last)

    def by_location(self) -> dict[str, dict[str, Any]]:
        """[ops] location -> {lagEntries, lagSeconds} of the last view (empty: the ledger is down)."""
        self._start()
        return {} if time.monotonic() - self._at > self.stale_s else dict(self._per_location)

    def _start(self) -> None:
        if self._thread is None:  # started by the first probe, in the serving process (after any fork)
            with self._start_lock:
                if self._thread is None:
                    if self.on_start is not None:  # the process's view of the locations behind the ledger
                        self.on_start()
                    self._thread = threading.Thread(target=self._refresh, name="ledger-status", daemon=True)
                    self._thread.start()


#: ``importer ledger verify``'s bound on the export lag: an applied shipment older than
#: this and still not in the ledger is drift (the exporter is stopped, stuck or too slow).
VERIFY_MAX_LAG_S = 60.0


def verify(store: RedisStore, ledger: PostgresLedger, settings: Settings, locations: list[str],
           max_lag_s: float = VERIFY_MAX_LAG_S) -> list[str]:
    """Drift between Redis and the ledger, one line each (none: all is well):
    per location and SKU the movements chain (each starts where the previous
    ended) and end at Redis's stock (counting the journal entries not exported
    yet); every done marker older than the hot window whose journal entry is
    not waiting for the exporter is in the ledger; and no applied shipment has
    waited for the exporter longer than ``max_lag_s``."""
    drift: list[str] = []
    for lag in export_lags(store, ledger, locations):
        if lag.entries and lag.seconds > max_lag_s:
            drift.append(f"{lag.location}: {lag.entries} applied shipment(s) not in the ledger, the oldest applied "
                         f"{lag.seconds:.0f} s ago (bound {max_lag_s:g} s): is `importer ledger` running?")
    cursors = ledger.cursors()
    now = store.server_time_ms()
    hot_cutoff = now - int(settings.ledger_hot_window_s * 1000)
    for location in locations:
        for sku, batch_id, before, previous in ledger.chain_breaks(location):
            drift.append(f"{location}: {sku}'s movement in batch {batch_id} starts at {before}, "
                         f"its previous movement ended at {previous if previous is not None else '0 (none before)'}")
        expected = ledger.last_afters(location)
        after = cursors.get(location, (ZERO, 0))[0]
        pending: set[str] = set()
        while entries := store.read_journal(location, after, 500):  # applied, not exported yet
            source = store.receipt_source(location, entries)
            for entry in entries:
                pending.add(entry.batch_id)
                chunks = source(entry)
                for m in movements(chunks) if chunks is not None else ():
                    expected[m.sku] = m.after
            after = entries[-1].stream_id
        k = store.partition(location)
        actual = {text_of(sku): int(units) for sku, units in store.client.hscan_iter(k.stock, count=1000)}
        for sku in sorted(set(expected) | set(actual)):
            if expected.get(sku, 0) != actual.get(sku, 0):
                drift.append(f"{location}: {sku} is {actual.get(sku, 0)} in Redis but its movements end at {expected.get(sku, 0)}")
        marked: list[str] = []
        for key in store.client.scan_iter(match=k.done("*"), count=1000):
            applied_at = store.client.hget(key, "appliedAt")
            batch_id = text_of(key)[len(k.done("")):]
            if applied_at is not None and int(applied_at) < hot_cutoff and batch_id not in pending:
                marked.append(batch_id)
        for start in range(0, len(marked), 500):
            chunk = marked[start:start + 500]
            held = ledger.archived(location, chunk)
            drift += [f"{location}: batch {b}'s done marker is past the hot window but not in the ledger"
                      for b in chunk if b not in held]
    return drift


def cmd_ledger_verify(location: str | None, max_lag_s: float = VERIFY_MAX_LAG_S) -> int:
    settings = Settings.from_env()
    exporter = build_exporter(settings)
    try:
        locations = [location] if location else exporter.store.locations()
        drift = verify(exporter.store, exporter.ledger, settings, locations, max_lag_s)
    finally:
        exporter.ledger.close()
        exporter.store.client.close()
    for line in drift:
        print(f"drift: {line}")
    checked = ", ".join(locations)
    if drift:
        print(f"ledger verify: {len(drift)} drift(s) at {checked}", file=sys.stderr)
        return 1
    print(f"ledger verify: clean at {checked} (movements chain and end at Redis's stock; every marker past the hot window "
          f"is in the ledger; no applied shipment waits for the exporter over {max_lag_s:g} s)")
    return 0


def cmd_ledger_restore(location: str | None, dry_run: bool) -> int:
    """`importer ledger restore [--location L] [--dry-run]`: bring Redis forward from the
    ledger at each location found behind (or at ``location`` whatever the check says);
    says what it did, or with --dry-run what it would do. Exit 1 when a location's lock
    is held by another restore."""
    from importer.adapters.logs import configure_logging

    configure_logging()
    settings = Settings.from_env()
    exporter = build_exporter(settings)
    sync = LedgerSync(exporter.store, exporter.ledger)
    if settings.fault:  # tests only: the restore stopped or killed at a chosen point
        from importer.adapters.bootstrap import fault_points

        sync.marker_chunk, sync.fault = 20, fault_points(settings.fault)
    try:
        behind = sync.check()
        if location is None:
            marked = set(exporter.store.behind_marks(exporter.store.locations()))
            locations = sorted(set(behind) | marked)
        else:
            locations = [location]
        for b in behind.values():
            print(f"{b.location}: behind the ledger by {b.shipments} shipment(s) over {b.seconds:.1f} s ({b.reason})")
        if not locations:
            print("ledger restore: no location is behind the ledger; nothing to do")
            return 0
        held = False
        for where in locations:
            report = sync.restore(where, dry_run=dry_run)
            held = held or report.held_elsewhere
            print(("dry run: " if dry_run else "") + report.line())
        return 1 if held else 0
    finally:
        exporter.ledger.close()
        exporter.store.client.close()


def cmd_ledger(once: bool) -> int:
    from importer.adapters.logs import configure_logging
    from importer.adapters.processes.signals import StopOnce

    configure_logging()
    settings = Settings.from_env()
    stop = StopOnce(name="ledger").install()
    exporter = build_exporter(settings)
    try:
        if not migrate_when_ready(exporter.ledger, stop.event):
            return 0
        _log("ledger.ready", hot_window_s=settings.ledger_hot_window_s, horizon_s=settings.idempotency_horizon_s)
        if once:
            while exporter.pass_once():
                pass
            _log("ledger.caught_up", exported=exporter.exported)
            return 0
        return exporter.run(stop.event)
    finally:
        exporter.ledger.close()
        exporter.store.client.close()
