"""What the operators (keys with the ``ops`` scope) see and do.

They see each declared location's queue (:class:`LocationQueue`), its recent
failures by code (:func:`recent_failures`) and the live workers
(:class:`LiveWorker`). They act: :func:`retry_failed` retries in bulk every
failed import of a location that failed with one code (after an outage), and
the store pauses and resumes intake. Every action is recorded with who did it
and when (:meth:`OpsStore.record_action`).

A bulk retry is the owner's retry (domain/retry_import.py) run for each
import, as its owner: the same checks, the same atomic step, and the same
guarantee that a shipment never applies twice (an applied batch replays).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from importer.domain.errors import JobNotFound, NotRetryable, NoWorkerAccepts
from importer.domain.jobs import JobRecord
from importer.domain.ports import MessageSender, RetryStore
from importer.domain.retry_import import RETRYABLE_CODES, retry_import

#: The buckets recent failures are counted in (the store's script uses the same: common.lua).
FIVE_MINUTES_MS = 300_000
HOUR_MS = 3_600_000
#: Every location (POST /api/ops/intake without a location).
EVERYWHERE = "*"


@dataclass(frozen=True)
class LocationQueue:
    """One location's queue, read in one step."""

    location: str
    now_ms: int
    waiting: int
    #: createdAt of the oldest waiting job (None: none waits).
    oldest_waiting_ms: int | None
    active: int
    retrying: int
    #: Failed job records still kept (retention removes them).
    failed_kept: int
    #: Attempts whose lease ran out, ever (a worker stalled or died).
    stalls: int
    #: The store's recent-failure counters: ``m<5-minute bucket>:<code>`` and ``h<hour>:<code>`` -> count.
    recent: dict[str, int] = field(default_factory=dict)

    @property
    def oldest_waiting_age_s(self) -> float:
        return 0.0 if self.oldest_waiting_ms is None else max(0.0, (self.now_ms - self.oldest_waiting_ms) / 1000)


def recent_failures(recent: dict[str, int], now_ms: int) -> tuple[dict[str, int], dict[str, int]]:
    """(code -> failures in the last hour, code -> failures in the last day), from
    the store's counters: twelve 5-minute buckets and twenty-four hourly ones, the
    current (partial) bucket included."""
    five, hour = now_ms // FIVE_MINUTES_MS, now_ms // HOUR_MS
    last_hour: dict[str, int] = {}
    last_day: dict[str, int] = {}
    for name, count in recent.items():
        kind, (bucket, _, code) = name[:1], name[1:].partition(":")
        if kind not in ("m", "h") or not bucket.isdigit() or not code:
            continue
        if kind == "m" and five - 12 < int(bucket) <= five:
            last_hour[code] = last_hour.get(code, 0) + count
        elif kind == "h" and hour - 24 < int(bucket) <= hour:
            last_day[code] = last_day.get(code, 0) + count
    return dict(sorted(last_hour.items())), dict(sorted(last_day.items()))


@dataclass(frozen=True)
class LiveWorker:
    """A worker process whose presence beat has not expired."""

    id: str
    accepts: frozenset[int]
    last_beat_age_s: float
    #: What the worker says of itself: release, host, pid, startedAt (ms), inFlight.
    info: dict[str, Any]


@dataclass(frozen=True)
class FailedImport:
    job_id: str
    owner: str
    code: str


class OpsStore(Protocol):
    """What the operators' routes ask of the store."""

    def locations(self) -> list[str]: ...
    def location_queue(self, location: str) -> LocationQueue: ...
    def workers_now(self) -> list[LiveWorker]: ...

    def intake(self) -> dict[str, dict[str, Any]]:
        """Paused intake: location (or ``*``) -> {by, at}; empty when intake runs everywhere."""
        ...

    def set_intake(self, location: str, *, paused: bool, by: str) -> None:
        """Pause or resume new uploads at a location, or at every one (``*``: resuming it resumes all)."""
        ...

    def failed_imports(
        self, location: str, *, code: str | None, limit: int, after: tuple[int, str] | None = None,
    ) -> tuple[list[FailedImport], tuple[int, str] | None]:
        """Failed imports at a location, newest first, only ``code``'s when given; the
        position to go on from (None: the end). Reads a bounded number of records per call."""
        ...

    def get_job(self, job_id: str) -> JobRecord | None:
        """Whoever's it is."""
        ...

    def get_diagnostic(self, job_id: str) -> str: ...
    def record_action(self, by: str, action: str, detail: dict[str, Any]) -> str: ...
    def actions(self, *, limit: int, before: str | None) -> tuple[list[dict[str, Any]], str | None]: ...


@dataclass
class BulkRetry:
    """What a bulk retry did."""

    retried: list[str] = field(default_factory=list)
    #: jobId -> why it was not retried (its stored upload is gone, it changed meanwhile...).
    skipped: dict[str, str] = field(default_factory=dict)
    #: More failed imports with that code remain (the limit was reached): call again.
    more: bool = False


class NotARetryableCode(ValueError):
    """The code is one a retry cannot change (a CSV issue, a conflict...)."""


def retry_failed(
    store: OpsStore, retries: RetryStore, sender: MessageSender, *, location: str, code: str, limit: int,
    uuidgen: Callable[[], str],
) -> BulkRetry:
    """Retry up to ``limit`` failed imports at ``location`` whose failure code is ``code``, each as its owner.

    A job that cannot be retried any more (its upload is gone, retention removed
    it, another retry won) is skipped with the reason. No live worker accepting
    this server's contract version: :class:`NoWorkerAccepts` when nothing was
    retried yet, else the run stops there with ``more``."""
    if code not in RETRYABLE_CODES:
        raise NotARetryableCode(code)
    done = BulkRetry()
    after: tuple[int, str] | None = None
    while len(done.retried) + len(done.skipped) < limit:
        page, after = store.failed_imports(location, code=code, limit=limit - len(done.retried) - len(done.skipped), after=after)
        for failed in page:
            try:
                retry_import(retries, sender, job_id=failed.job_id, owner=failed.owner, upload_id=uuidgen())
                done.retried.append(failed.job_id)
            except NotRetryable as refused:
                done.skipped[failed.job_id] = str(refused)
            except JobNotFound:
                done.skipped[failed.job_id] = "gone: retention removed its record"
            except NoWorkerAccepts:
                if not done.retried:
                    raise
                done.more = True
                return done
        if after is None:
            return done
    done.more = after is not None
    return done
