"""Prometheus metrics for GET /metrics (prometheus-client's text format).

Queue-wide numbers come from Redis at scrape time, so every HTTP process
answers the same: waiting jobs, age of the oldest waiting job, active jobs,
and counters the Lua scripts keep in ``P:stats`` in the same step as the state
change they count (completed, failed by code, retries, rows applied,
replays, and a histogram of attempt durations from active to finished).
``importer_redis_errors_total`` is per HTTP process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from importer.adapters.postgres.errors import LedgerUnavailable
from importer.adapters.postgres.ledger import PostgresLedger
from importer.adapters.redis.errors import StoreUnavailable
from importer.adapters.redis.store import RedisStore
from importer.adapters.redis.scripts import DURATION_BUCKETS_MS  # the buckets the scripts count into


class QueueCollector(Collector):
    def __init__(self, store: RedisStore, on_error: Any) -> None:
        self.store = store
        self.on_error = on_error

    def collect(self) -> Iterator[Any]:
        try:
            stats = self.store.queue_stats()
        except StoreUnavailable:
            self.on_error()
            yield GaugeMetricFamily("importer_redis_up", "1 when Redis answered this scrape.", value=0)
            return
        yield GaugeMetricFamily("importer_redis_up", "1 when Redis answered this scrape.", value=1)
        yield GaugeMetricFamily("importer_jobs_waiting", "Jobs waiting for their first attempt.", value=stats.waiting)
        yield GaugeMetricFamily(
            "importer_oldest_waiting_job_age_seconds", "Age of the oldest waiting job (0 when none).",
            value=stats.oldest_waiting_age_s,
        )
        yield GaugeMetricFamily("importer_jobs_active", "Jobs in an attempt right now.", value=stats.active)
        try:
            alive = len(self.store.live_workers())
        except StoreUnavailable:
            self.on_error()
            alive = 0
        yield GaugeMetricFamily("importer_workers_alive", "Live workers, as the door check sees them (heartbeat not expired).",
                                value=alive)
        c = stats.counters
        yield CounterMetricFamily("importer_jobs_completed", "Jobs completed (replays included).", value=c.get("completed", 0))
        failed = CounterMetricFamily("importer_jobs_failed", "Jobs failed, by stable error code.", labels=["code"])
        for key, value in sorted(c.items()):
            if key.startswith("failed:"):
                failed.add_metric([key.removeprefix("failed:")], value)
        yield failed
        yield CounterMetricFamily("importer_retries", "Attempts that failed and will be retried.", value=c.get("retries", 0))
        yield CounterMetricFamily("importer_rows_applied", "Rows (line items) added to stock.", value=c.get("rows_applied", 0))
        yield CounterMetricFamily("importer_replays", "Jobs that found their batch already applied.", value=c.get("replays", 0))
        cumulative = 0
        buckets = []
        for le in DURATION_BUCKETS_MS:
            cumulative += c.get(f"duration_le:{le}", 0)
            buckets.append((str(le / 1000), cumulative))
        cumulative += c.get("duration_le:+Inf", 0)
        buckets.append(("+Inf", cumulative))
        yield HistogramMetricFamily(
            "importer_attempt_duration_seconds", "Duration of finished attempts, from active to completed or failed.",
            buckets=buckets, sum_value=c.get("duration_sum_ms", 0) / 1000,
        )


class LedgerCollector(Collector):
    """[ledger] How far the ledger is behind each location's journal, read at scrape time."""

    def __init__(self, store: RedisStore, ledger: PostgresLedger) -> None:
        self.store = store
        self.ledger = ledger

    def collect(self) -> Iterator[Any]:
        from importer.adapters.processes.ledger import export_lags

        try:
            lags = export_lags(self.store, self.ledger)
        except (LedgerUnavailable, StoreUnavailable):
            yield GaugeMetricFamily("importer_ledger_up", "1 when the ledger (PostgreSQL) answered this scrape.", value=0)
            return
        yield GaugeMetricFamily("importer_ledger_up", "1 when the ledger (PostgreSQL) answered this scrape.", value=1)
        entries = GaugeMetricFamily(
            "importer_ledger_lag_entries", "Applied shipments not yet committed in the ledger.", labels=["location"])
        seconds = GaugeMetricFamily(
            "importer_ledger_lag_seconds", "Age of the oldest applied shipment not yet in the ledger (0: none).",
            labels=["location"])
        behind = GaugeMetricFamily(
            "importer_redis_behind_ledger_shipments",
            "Shipments the ledger holds that this location's Redis lacked when it was found behind "
            "(restored from an older backup, emptied): 0 once brought forward.", labels=["location"])
        try:
            marks = self.store.behind_marks(lag.location for lag in lags)
        except StoreUnavailable:
            marks = {}
        for lag in lags:
            entries.add_metric([lag.location], lag.entries)
            seconds.add_metric([lag.location], lag.seconds)
            behind.add_metric([lag.location], int(marks.get(lag.location, {}).get("shipments") or 0))
        yield entries
        yield seconds
        yield behind


class HttpMetrics:
    """The registry of one HTTP process."""

    def __init__(self, store: RedisStore, ledger: PostgresLedger | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.redis_errors = Counter(
            "importer_redis_errors", "Redis errors seen by this HTTP process.", registry=self.registry
        )
        self.registry.register(QueueCollector(store, self.redis_errors.inc))
        if ledger is not None:
            self.registry.register(LedgerCollector(store, ledger))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
