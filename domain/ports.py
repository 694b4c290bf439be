"""The ports the two use cases drive, as ``typing.Protocol``s, and what they return.

The Redis store (adapters/redis_store.py) and the dramatiq producer
(adapters/queue.py) implement them; unit tests use the small fakes in
tests/unit/fakes.py. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from importer.domain.errors import PublicError
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
    kind: Literal["created", "exists", "conflict", "no_worker", "rate_limited", "content_needed"]
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


class JobRecorder(Protocol):
    """Producer side of the store: records a job (once per jobId) with its upload."""

    def enqueue(
        self, *, job_id: str, batch_id: str, owner: str, content_sha256: str, upload_id: str, csv: bytes,
        raw_sha256: str = "", stored_content: tuple[str, str] | None = None, rate_token: bool = False,
    ) -> EnqueueOutcome:
        """Record the job once.

        ``raw_sha256``: the hash of the upload's bytes; ``content_sha256``
        its content key (domain/shipment.py content_key), or "" when not
        computed: then a batch known with other bytes answers
        'content_needed'. ``stored_content``: (uploadId, content key) of the
        live job's stored upload, computed by the caller after such an answer.
        ``rate_token``: first take one POST of the owner's rate limit, in the
        same atomic step ('rate_limited' when it is used up: nothing recorded).
        """
        ...

    def read_upload(self, upload_id: str) -> bytes | None:
        """A stored upload (None once retention removed it with its job)."""
        ...

    def mark_sent(self, job_id: str) -> None: ...


class MessageSender(Protocol):
    """Sends the versioned queue message of a recorded job."""

    def send(self, *, job_id: str, batch_id: str, upload_id: str) -> None: ...


class AttemptStore(Protocol):
    """Worker side of the store: one atomic step per state transition of an attempt."""

    def start_attempt(self, job_id: str, upload_id: str) -> StartOutcome: ...

    def validated_and_apply(
        self, *, job_id: str, upload_id: str, attempt: int, batch_id: str, owner: str, shipment: Shipment,
        token: str = "",
    ) -> ApplyResult: ...

    def record_failure(
        self, *, job_id: str, attempt: int | None, final: bool, error: PublicError, diagnostic: str,
        next_attempt_at_ms: int | None, token: str = "",
    ) -> str: ...

    def start_and_apply(
        self, *, job_id: str, upload_id: str, batch_id: str, shipment: Shipment,
    ) -> tuple[StartOutcome, ApplyResult | None]:
        """Start the attempt, record 'validated' and apply, as one atomic step,
        for a shipment validated from the job's own upload before the attempt
        started. The apply result is None when the attempt did not start."""
        ...


class EventLog(Protocol):
    """Where the use cases say what happened (JSON log lines in production)."""

    def __call__(self, event: str, level: int = ..., **fields: Any) -> None: ...


#: Called once an attempt has started, with (jobId, attempt, fencing token).
OnStarted = Callable[[str, int, str], None]
