"""The ports the two use cases drive, as ``typing.Protocol``s, and what they return.

The Redis store (adapters/redis/store.py) and the dramatiq producer
(adapters/dramatiq/) implement them; unit tests use the small fakes in
tests/unit/fakes.py. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

from importer.domain.errors import PublicError
from importer.domain.jobs import JobRecord, RejectionReport, ShipmentRecord
from importer.domain.receipt import StoredReceipt
from importer.domain.shipment import Shipment


@dataclass(frozen=True)
class EnqueueOutcome:
    """What recording a job did."""

    #: 'no_worker': live workers exist and none accepts the producer's
    #: contract version; nothing was recorded (the door check).
    #: 'rate_limited': the owner's rate limit, taken in the same step, is used
    #: up for this window; nothing was recorded.
    #: 'content_needed': the batch is known (a live job or its done marker) with
    #: other bytes; nothing was recorded: ask again with the upload's content
    #: key (and, with ``stored_upload_id``, the stored upload's).
    #: 'ask_ledger' [ledger]: no job and no done marker, and the batch's marker may have
    #: been pruned: ask the ledger, then enqueue again with ``ledger_asked``.
    #: 'undeclared': the location is not one an operator declared; nothing was written.
    #: 'paused': an operator paused intake here or everywhere; nothing was written.
    #: 'behind' [ledger]: this location's store is behind the ledger (restored from an older
    #: backup, emptied): it lacks shipments the ledger holds; nothing was written.
    kind: Literal["created", "exists", "conflict", "no_worker", "rate_limited", "content_needed", "ask_ledger",
                  "undeclared", "paused", "behind"]
    #: The job's state when it exists ('waiting' for a new one).
    state: str = ""
    #: A new job's message was written in the same atomic step as its record
    #: (the Redis transport): there is nothing left to send.
    sent: bool = False
    #: 'no_worker': the version refused, and every version the live workers accept.
    producer_version: int = 0
    workers_accept: frozenset[int] = frozenset()
    #: 'rate_limited': milliseconds until the owner's window ends.
    retry_after_ms: int = 0
    #: 'content_needed': the live job's upload, when its content key is not
    #: known yet (its producer recorded only its bytes' hash).
    stored_upload_id: str = ""


@dataclass(frozen=True)
class EnqueueCall:
    """One job to record (:meth:`JobRecorder.enqueue`'s arguments), for :meth:`JobRecorder.enqueue_many`."""

    job_id: str
    batch_id: str
    owner: str
    upload_id: str
    csv: bytes
    raw_sha256: str
    rate_token: bool = False
    send_later: bool = False


@dataclass(frozen=True)
class StartedAttempt:
    """An attempt that started: its number and what it needs to run."""

    attempt: int
    batch_id: str
    owner: str
    content_sha256: str
    csv: bytes
    #: Fencing token of this attempt: the store accepts its writes only while
    #: the job is active under this token (a newer attempt gets a new one).
    token: str = ""


@dataclass(frozen=True)
class StartOutcome:
    """What starting an attempt did; ``started`` is set only when kind is 'started'."""

    #: 'busy': another attempt holds the job under a live lease; this delivery is a duplicate.
    kind: Literal["started", "missing", "stale", "finished", "exhausted", "upload_missing", "busy"]
    attempt: int = 0
    started: StartedAttempt | None = None
    state: str = ""


@dataclass(frozen=True)
class ApplyResult:
    """What the atomic apply did to stock and to the job."""

    #: 'stale': a newer attempt holds the job (fenced off); nothing changed.
    kind: Literal["applied", "replayed", "conflict", "overflow", "finished", "missing", "stale"]
    result: dict[str, Any] | None = None
    detail: str = ""


class OneStepImport(NamedTuple):
    """One import for a one-step attempt (start, validated, apply, in one atomic
    step): its job, upload and validated shipment, and the transport's
    acknowledgement of the message that brought the upload (opaque here; None: none)."""

    job_id: str
    upload_id: str
    batch_id: str
    shipment: Shipment
    ack: Any = None


class JobRecorder(Protocol):
    """Producer side of the store: records a job (once per jobId) with its upload."""

    def enqueue(
        self, *, job_id: str, batch_id: str, owner: str, content_sha256: str, upload_id: str, csv: bytes,
        raw_sha256: str = "", stored_content: tuple[str, str] | None = None, rate_token: bool = False,
        ledger_asked: bool = False, send_later: bool = False,
    ) -> EnqueueOutcome:
        """Record the job once.

        ``raw_sha256``: the hash of the upload's bytes; ``content_sha256``
        its content key (domain/shipment.py content_key), or "" when not
        computed: then a batch known with other bytes answers
        'content_needed'. ``stored_content``: (uploadId, content key) of the
        live job's stored upload, computed by the caller after such an answer.
        ``rate_token``: first take one POST of the owner's rate limit, in the
        same atomic step ('rate_limited' when it is used up: nothing recorded).
        ``send_later``: record it without its message, in the unsent index
        (``sent`` False), even where the store could write the message: the
        caller sends it with others (a group) and marks them sent.
        """
        ...

    def enqueue_many(self, calls: Sequence[EnqueueCall]) -> list[EnqueueOutcome]:
        """:meth:`enqueue` of each (its first call: no content key, no stored
        content, the ledger not asked), in order, each its own atomic step as
        if called one after the other, in as few round trips as the store can
        make them. Raises what :meth:`enqueue` raises (the store unreachable):
        then any of them may or may not be recorded, as with a lost answer."""
        ...

    def read_upload(self, upload_id: str, location: str = ...) -> bytes | None:
        """A stored upload at a location (None once retention removed it with its job)."""
        ...

    def mark_sent(self, job_id: str) -> None: ...

    def mark_sent_many(self, job_ids: list[str]) -> None:
        """:meth:`mark_sent` for several jobs of one location, in one step."""
        ...


@dataclass(frozen=True)
class RetryOutcome:
    """What asking for a retry of a job did (RetryStore.retry_job)."""

    #: 'missing': no record, or another owner's (the same answer, after the same work).
    #: 'not_retryable': nothing changed; ``reason`` says why (domain/retry_import.py).
    #: 'no_worker': live workers exist and none accepts the producer's contract version
    #: (the door check, as for a new job); nothing changed.
    kind: Literal["retried", "missing", "not_retryable", "no_worker"]
    #: 'retried': the job's batchId, and how many retries it has had (this one included).
    batch_id: str = ""
    retries: int = 0
    #: 'retried': the message was written in the same atomic step (the Redis transport).
    sent: bool = False
    #: 'not_retryable': 'state' (not failed), 'code' (its failure cannot change), 'upload_gone';
    #: with the job's state and its failure's code ('' when none).
    reason: str = ""
    state: str = ""
    error_code: str = ""
    #: 'no_worker': the version refused, and every version the live workers accept.
    producer_version: int = 0
    workers_accept: frozenset[int] = frozenset()


class RetryStore(Protocol):
    """Retries a failed job: one atomic step that checks and starts its new attempt chain."""

    def retry_job(self, *, job_id: str, owner: str, upload_id: str, retryable: frozenset[str]) -> RetryOutcome:
        """Retry ``owner``'s job ``job_id`` when it is failed with a code in
        ``retryable`` and its upload is kept: state waiting, attempt counters
        reset, error cleared, out of the failed indexes, an event ``waiting``
        with ``{"retry": n}``; its upload now under ``upload_id`` (so a
        message of the earlier chain finds itself stale). The done marker is
        not touched. A missing job and another owner's answer 'missing' alike.
        Like a new job it passes the door check ('no_worker')."""
        ...

    def mark_sent(self, job_id: str) -> None: ...


class MessageSender(Protocol):
    """Sends the versioned queue message of a recorded job."""

    def send(self, *, job_id: str, batch_id: str, upload_id: str) -> None: ...

    def send_group(self, jobs: Sequence[tuple[str, str, str]]) -> None:
        """One message (contract version 3) for several recorded jobs of one
        location, each (jobId, batchId, uploadId); at most contract.GROUP_MAX."""
        ...


class AttemptStore(Protocol):
    """Worker side of the store: one atomic step per state transition of an attempt."""

    def start_attempt(self, job_id: str, upload_id: str) -> StartOutcome: ...

    def validated_and_apply(
        self, *, job_id: str, upload_id: str, attempt: int, batch_id: str, owner: str, shipment: Shipment,
        token: str = "",
    ) -> ApplyResult: ...

    def record_failure(
        self, *, job_id: str, attempt: int | None, final: bool | None, error: PublicError, diagnostic: str,
        next_attempt_at_ms: int | None, token: str = "", outage: bool = False,
    ) -> str:
        """'retrying' or 'failed'. ``final`` None: final once the attempts that
        count reach the maximum; ``outage``: the store was away, the attempt
        does not count."""
        ...

    def start_and_apply(
        self, *, job_id: str, upload_id: str, batch_id: str, shipment: Shipment, ack: Any = None,
    ) -> tuple[StartOutcome, ApplyResult | None]:
        """Start the attempt, record 'validated' and apply, as one atomic step,
        for a shipment validated from the job's own upload before the attempt
        started. ``ack``: the transport's acknowledgement of the message that
        brought the upload (opaque here), made in the same step; None: none.
        The apply result is None when the attempt did not start."""
        ...

    def start_and_apply_together(self, imports: Sequence[OneStepImport]) -> list[tuple[StartOutcome, ApplyResult | None]]:
        """:meth:`start_and_apply` for several imports of one location, in one
        atomic step: each has its own outcome, in order (a conflict or an
        overflow fails only its own job)."""
        ...

    def read_small_uploads(self, jobs: Sequence[tuple[str, str]], max_bytes: int) -> list[bytes | None]:
        """Each (jobId, uploadId)'s upload when at most ``max_bytes`` (else None), in one step."""
        ...


class JobReads(Protocol):
    """Owner-scoped reads: None for a missing record and for another owner's
    alike, having read nothing of the latter but its owner."""

    def get_owned_job(self, job_id: str, owner: str) -> JobRecord | None: ...
    def get_owned_shipment(self, batch_id: str, owner: str, location: str = ...) -> ShipmentRecord | None: ...
    # (state, report or None when it has none), or None as get_owned_job.
    def get_owned_rejections(self, job_id: str, owner: str) -> tuple[str, RejectionReport | None] | None: ...
    def list_jobs(
        self, owner: str, *, limit: int, state: str | None = None, after: tuple[int, str] | None = None,
        location: str | None = None, within: frozenset[str] | None = None,
    ) -> tuple[list[JobRecord], tuple[int, str] | None]:
        """At one location, or across every location the owner has jobs at
        (None), of those in ``within`` only when it is given (a key's locations)."""
        ...


class ReceiptStore(Protocol):
    """A receipt with its done marker and first bytes (None as JobReads); then the rest, in ranges."""

    def get_owned_receipt(self, batch_id: str, owner: str, head_bytes: int, location: str = ...) -> StoredReceipt | None: ...
    def read_receipt(self, batch_id: str, start: int, length: int, location: str = ...) -> bytes: ...


class JobEventSource(Protocol):
    """A job's own events after a stream id, waiting up to block_ms for new ones."""

    def get_owned_job(self, job_id: str, owner: str) -> JobRecord | None: ...
    def job_events(self, job_id: str, after_id: str, block_ms: int | None) -> list[dict[str, Any]]: ...


class StoreHealth(Protocol):
    """What /health and the producer's rate limit ask of the store."""

    def take_rate_token(self, owner: str) -> int: ...
    def ping(self) -> bool: ...
    def live_workers(self) -> dict[str, frozenset[int]]: ...


class StockNow(Protocol):
    """A location's stock as the live store holds it (GET /api/stock without asOf)."""

    def stock_now(self, location: str, *, limit: int, cursor: int) -> tuple[list[tuple[str, int]], int]:
        """One page of (sku, units) and the next cursor (0 at the end)."""
        ...

    def sku_now(self, location: str, sku: str) -> int | None: ...


class JobStore(JobRecorder, RetryStore, JobReads, ReceiptStore, JobEventSource, StoreHealth, StockNow, Protocol):
    """Everything the HTTP side needs of the store."""


class EventLog(Protocol):
    """Where the use cases say what happened (JSON log lines in production)."""

    def __call__(self, event: str, level: int = ..., **fields: Any) -> None: ...


#: Called once an attempt has started, with (jobId, attempt, fencing token).
OnStarted = Callable[[str, int, str], None]
