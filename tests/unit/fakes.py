"""Small typed fakes of the ports, for unit tests of the handlers and use cases.

A dict-backed JobStore and a list-backed MessageSender; no mocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from dataclasses import dataclass, field, replace

from importer.domain.locations import MAIN, location_of_job
from importer.domain.contract import live_workers_can_run
from importer.domain.jobs import JobRecord, JobState, RejectionReport, ShipmentRecord
from importer.domain.errors import PublicError
from importer.domain.ports import ApplyResult, EnqueueCall, EnqueueOutcome, OneStepImport, RetryOutcome, StartedAttempt, StartOutcome
from importer.domain.receipt import StoredReceipt
from importer.domain.shipment import Shipment

NOW_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


class StoreDown(Exception):
    """The fake's "cannot reach the store" error (listed in Api.unavailable_errors)."""


@dataclass
class FakeStore:
    """A JobStore keeping job records in a dict; ``failure`` makes every method raise it."""

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    shipments: dict[str, ShipmentRecord] = field(default_factory=dict)
    uploads: dict[str, bytes] = field(default_factory=dict)
    #: jobId -> its rejection report (served only while the job's record is failed).
    rejections: dict[str, RejectionReport] = field(default_factory=dict)
    marked_sent: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    failure: BaseException | None = None
    #: jobId -> its events, as RedisStore.job_events returns them (ids "ms-seq", ascending).
    events: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    #: What take_rate_token answers (0 = allowed), and the owners it was asked for.
    rate_wait_ms: int = 0
    rate_tokens: list[str] = field(default_factory=list)
    #: Writes the message with the record, as the Redis store does on the Redis transport.
    sends_with_record: bool = False
    #: batchId -> the stored receipt bytes (as apply.lua writes them; see domain/receipt.py).
    receipts: dict[str, bytes] = field(default_factory=dict)
    #: Make read_receipt raise this from its n-th call on (a store lost in mid-stream).
    receipt_failure: tuple[int, BaseException] | None = None
    #: The door check: the live workers' accepted versions (worker id -> versions), the producer's version.
    workers: dict[str, frozenset[int]] = field(default_factory=dict)
    producer_version: int = 1
    #: jobId -> the SHA-256 of its upload's bytes (the record's rawSha256).
    raw_hashes: dict[str, str] = field(default_factory=dict)

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.failure is not None:
            raise self.failure

    def enqueue(
        self, *, job_id: str, batch_id: str, owner: str, content_sha256: str, upload_id: str, csv: bytes,
        raw_sha256: str = "", stored_content: tuple[str, str] | None = None, rate_token: bool = False,
        send_later: bool = False,
    ) -> EnqueueOutcome:
        """As enqueue.lua decides (its [rate], [identity] and [door] steps, in its order)."""
        self._call("enqueue")
        if rate_token:
            self.rate_tokens.append(owner)
            if self.rate_wait_ms:
                return EnqueueOutcome("rate_limited", retry_after_ms=self.rate_wait_ms)
        existing = self.jobs.get(job_id)
        if existing is not None:
            if existing.owner != owner:
                return EnqueueOutcome("conflict")
            if raw_sha256 and self.raw_hashes.get(job_id) == raw_sha256:
                return EnqueueOutcome("exists", existing.state)
            stored = existing.content_sha256
            if not stored:
                if stored_content is None or stored_content[0] != existing.upload_id:
                    return EnqueueOutcome("content_needed", stored_upload_id=existing.upload_id)
                if not stored_content[1]:
                    return EnqueueOutcome("conflict")  # that upload is gone: not shown to be the same
                stored = stored_content[1]
                self.jobs[job_id] = replace(existing, content_sha256=stored)
            if not content_sha256:
                return EnqueueOutcome("content_needed")
            return EnqueueOutcome("exists", existing.state) if stored == content_sha256 else EnqueueOutcome("conflict")
        marker = self.shipments.get(batch_id)
        if marker is not None:
            if marker.owner != owner:
                return EnqueueOutcome("conflict")
            if not content_sha256:
                return EnqueueOutcome("content_needed")
            if marker.content_sha256 != content_sha256:
                return EnqueueOutcome("conflict")
        if not live_workers_can_run(self.producer_version, list(self.workers.values())):
            accepted = frozenset().union(*self.workers.values())
            return EnqueueOutcome("no_worker", producer_version=self.producer_version, workers_accept=accepted)
        self.jobs[job_id] = JobRecord(
            id=job_id, batch_id=batch_id, owner=owner, state="waiting", attempt=0,
            progress=None, result=None, error=None, created_at_ms=NOW_MS, updated_at_ms=NOW_MS,
            content_sha256=content_sha256, upload_id=upload_id,
        )
        self.raw_hashes[job_id] = raw_sha256
        self.uploads[upload_id] = csv
        return EnqueueOutcome("created", "waiting", sent=self.sends_with_record and not send_later)

    def enqueue_many(self, calls: Sequence[EnqueueCall]) -> list[EnqueueOutcome]:
        """Each enqueue, in order (the store's one round trip is one loop here)."""
        return [
            self.enqueue(job_id=c.job_id, batch_id=c.batch_id, owner=c.owner, content_sha256="", upload_id=c.upload_id,
                         csv=c.csv, raw_sha256=c.raw_sha256, rate_token=c.rate_token, send_later=c.send_later)
            for c in calls
        ]

    def retry_job(self, *, job_id: str, owner: str, upload_id: str, retryable: frozenset[str]) -> RetryOutcome:
        """As retry.lua decides: the owner first, then the state, the failure's code, the upload, the door."""
        self._call("retry_job")
        record = self.jobs.get(job_id)
        if record is None or record.owner != owner or job_id != f"shipment-{record.batch_id}":
            return RetryOutcome("missing")
        if record.state != JobState.FAILED:
            return RetryOutcome("not_retryable", reason="state", state=record.state)
        code = record.error.get("code") if isinstance(record.error, dict) else None
        code = code if isinstance(code, str) else ""
        if code not in retryable:
            return RetryOutcome("not_retryable", reason="code", state=record.state, error_code=code)
        if record.upload_id not in self.uploads:
            return RetryOutcome("not_retryable", reason="upload_gone", state=record.state, error_code=code)
        if not live_workers_can_run(self.producer_version, list(self.workers.values())):
            accepted = frozenset().union(*self.workers.values())
            return RetryOutcome("no_worker", producer_version=self.producer_version, workers_accept=accepted)
        self.uploads[upload_id] = self.uploads.pop(record.upload_id)
        retries = record.retries + 1
        self.jobs[job_id] = replace(
            record, state=JobState.WAITING, attempt=0, progress=None, result=None, error=None, updated_at_ms=NOW_MS,
            started_at_ms=None, finished_at_ms=None, next_attempt_at_ms=None, upload_id=upload_id, retries=retries,
        )
        events = self.events.setdefault(job_id, [])
        last = str(events[-1]["id"]) if events else f"{NOW_MS}-0"
        ms, seq = last.split("-")
        events.append({
            "id": f"{ms}-{int(seq) + 1}", "event": "waiting", "jobId": job_id, "batchId": record.batch_id,
            "attempt": 0, "data": {"retry": retries},
        })
        return RetryOutcome("retried", batch_id=record.batch_id, retries=retries, sent=self.sends_with_record)

    def read_upload(self, upload_id: str, location: str = MAIN) -> bytes | None:
        self._call("read_upload")
        return self.uploads.get(upload_id)

    def take_rate_token(self, owner: str) -> int:
        if self.failure is not None:
            raise self.failure
        self.rate_tokens.append(owner)
        return self.rate_wait_ms

    def mark_sent(self, job_id: str) -> None:
        self._call("mark_sent")
        self.marked_sent.append(job_id)

    def mark_sent_many(self, job_ids: list[str]) -> None:
        self._call("mark_sent_many")
        self.marked_sent.extend(job_ids)

    def get_owned_job(self, job_id: str, owner: str) -> JobRecord | None:
        self._call("get_owned_job")
        record = self.jobs.get(job_id)
        return record if record is not None and record.owner == owner else None

    def get_owned_shipment(self, batch_id: str, owner: str, location: str = MAIN) -> ShipmentRecord | None:
        """``shipments`` holds main's by batchId, another location's by '<batchId>@<location>'."""
        self._call("get_owned_shipment")
        record = self.shipments.get(_at(batch_id, location))
        return record if record is not None and record.owner == owner else None

    def get_owned_receipt(self, batch_id: str, owner: str, head_bytes: int, location: str = MAIN) -> StoredReceipt | None:
        self._call("get_owned_receipt")
        batch_id = _at(batch_id, location)
        record = self.shipments.get(batch_id)
        if record is None or record.owner != owner:
            return None
        data = self.receipts.get(batch_id, b"")
        return StoredReceipt(record, len(data), data[:head_bytes])

    def read_receipt(self, batch_id: str, start: int, length: int, location: str = MAIN) -> bytes:
        self._call("read_receipt")
        if self.receipt_failure is not None:
            after, error = self.receipt_failure
            if self.calls.count("read_receipt") >= after:
                raise error
        return self.receipts.get(_at(batch_id, location), b"")[start:start + length]

    def get_owned_rejections(self, job_id: str, owner: str) -> tuple[str, RejectionReport | None] | None:
        self._call("get_owned_rejections")
        record = self.jobs.get(job_id)
        if record is None or record.owner != owner:
            return None
        return record.state, (self.rejections.get(job_id) if record.state == JobState.FAILED else None)

    def ping(self) -> bool:
        self._call("ping")
        return True

    def live_workers(self) -> dict[str, frozenset[int]]:
        self._call("live_workers")
        return dict(self.workers)

    def list_jobs(
        self, owner: str, *, limit: int, state: str | None = None, after: tuple[int, str] | None = None,
        location: str | None = None, within: frozenset[str] | None = None,
    ) -> tuple[list[JobRecord], tuple[int, str] | None]:
        self._call("list_jobs")
        mine = sorted(
            (
                r for r in self.jobs.values() if r.owner == owner and location in (None, location_of_job(r.id))
                and (location is not None or within is None or location_of_job(r.id) in within)
            ),
            key=lambda r: (r.created_at_ms, r.id), reverse=True,
        )
        if after is not None:
            mine = [r for r in mine if (r.created_at_ms, r.id) < after]
        if state:
            mine = [r for r in mine if r.state == state]
        page = mine[:limit]
        return page, ((page[-1].created_at_ms, page[-1].id) if len(mine) > limit else None)

    def job_events(self, job_id: str, after_id: str, block_ms: int | None) -> list[dict[str, object]]:
        self._call("job_events")

        def position(stream_id: object) -> tuple[int, int]:
            ms, seq = str(stream_id).split("-")
            return int(ms), int(seq)

        return [e for e in self.events.get(job_id, []) if position(e["id"]) > position(after_id)]


@dataclass(frozen=True)
class SentMessage:
    job_id: str
    batch_id: str
    upload_id: str


@dataclass
class FakeSender:
    """A MessageSender recording every message."""

    sent: list[SentMessage] = field(default_factory=list)

    #: The group messages, each its (jobId, batchId, uploadId)s.
    groups: list[list[tuple[str, str, str]]] = field(default_factory=list)

    def send(self, *, job_id: str, batch_id: str, upload_id: str) -> None:
        self.sent.append(SentMessage(job_id, batch_id, upload_id))

    def send_group(self, jobs: Sequence[tuple[str, str, str]]) -> None:
        self.groups.append(list(jobs))


@dataclass
class CountingUuids:
    issued: list[str] = field(default_factory=list)

    def __call__(self) -> str:
        value = f"{len(self.issued) + 1:032x}"
        self.issued.append(value)
        return value


@dataclass
class FakeAttemptStore:
    """The worker side of the store over one job: counts attempts, records outcomes."""

    csv: bytes
    batch_id: str = "b-1"
    owner: str = "owner-a"
    state: str = "waiting"
    attempt: int = 0
    applied: list[str] = field(default_factory=list)
    failures: list[tuple[str, bool]] = field(default_factory=list)
    #: The store calls, in order ('start', 'apply', 'start_and_apply', 'fail').
    calls: list[str] = field(default_factory=list)
    #: The acks handed to start_and_apply, in order.
    acks: list[Any] = field(default_factory=list)

    def start_and_apply(
        self, *, job_id: str, upload_id: str, batch_id: str, shipment: Shipment, ack: Any = None,
    ) -> tuple[StartOutcome, ApplyResult | None]:
        self.acks.append(ack)
        outcome = self.start_attempt(job_id, upload_id)
        self.calls[-1] = "start_and_apply"
        if outcome.started is None:
            return outcome, None
        applied = self.validated_and_apply(
            job_id=job_id, upload_id=upload_id, attempt=outcome.attempt, batch_id=batch_id,
            owner=outcome.started.owner, shipment=shipment, token=outcome.started.token,
        )
        self.calls.pop()
        return outcome, applied

    def read_small_uploads(self, jobs: Sequence[tuple[str, str]], max_bytes: int) -> list[bytes | None]:
        return [self.csv if 0 < len(self.csv) <= max_bytes else None for _ in jobs]

    def start_and_apply_together(self, imports: Sequence[OneStepImport]) -> list[tuple[StartOutcome, ApplyResult | None]]:
        return [
            self.start_and_apply(job_id=i.job_id, upload_id=i.upload_id, batch_id=i.batch_id, shipment=i.shipment, ack=i.ack)
            for i in imports
        ]

    def start_attempt(self, job_id: str, upload_id: str) -> StartOutcome:
        self.calls.append("start")
        if self.state in ("completed", "failed"):
            return StartOutcome("finished", state=self.state)
        self.attempt += 1
        self.state = "active"
        return StartOutcome("started", self.attempt, StartedAttempt(self.attempt, self.batch_id, self.owner, "", self.csv))

    def validated_and_apply(
        self, *, job_id: str, upload_id: str, attempt: int, batch_id: str, owner: str, shipment: Shipment,
        token: str = "",
    ) -> ApplyResult:
        self.calls.append("apply")
        kind = "replayed" if batch_id in self.applied else "applied"
        self.applied.append(batch_id)
        self.state = "completed"
        return ApplyResult(kind, {"imported": shipment.row_count, "batchId": batch_id})  # type: ignore[arg-type]

    def record_failure(
        self, *, job_id: str, attempt: int | None, final: bool | None, error: PublicError, diagnostic: str,
        next_attempt_at_ms: int | None, token: str = "", outage: bool = False,
    ) -> str:
        self.calls.append("fail")
        self.failures.append((error.code, bool(final)))
        self.state = "failed" if final else "retrying"
        return self.state


@dataclass
class EventRecorder:
    """An EventLog keeping (event, fields) pairs, and each one's level."""

    events: list[tuple[str, dict[str, object]]] = field(default_factory=list)
    levels: dict[str, int] = field(default_factory=dict)

    def __call__(self, event: str, level: int = 20, **fields: object) -> None:
        self.events.append((event, fields))
        self.levels[event] = level


def _at(batch_id: str, location: str) -> str:
    return batch_id if location == MAIN else f"{batch_id}@{location}"
