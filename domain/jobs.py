"""The job record as the API shows it: a plain value, built from storage by an adapter."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from importer.domain.errors import CsvIssue


class JobState(StrEnum):
    """The states of a job record. The Lua scripts write the same strings
    (tests/unit/test_lua_scripts.py checks that they use no other)."""

    WAITING = "waiting"
    ACTIVE = "active"
    RETRYING = "retrying"
    COMPLETED = "completed"
    FAILED = "failed"


FINISHED_STATES = frozenset({JobState.COMPLETED, JobState.FAILED})


@dataclass(frozen=True)
class JobRecord:
    id: str
    batch_id: str
    owner: str
    state: JobState
    attempt: int
    progress: dict[str, object] | None
    result: dict[str, object] | None
    #: The public part of the error only (code, message, CSV issues).
    error: dict[str, object] | None
    created_at_ms: int
    updated_at_ms: int
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    next_attempt_at_ms: int | None = None
    content_sha256: str = ""
    upload_id: str = ""
    #: How many times its owner retried it (each retry starts a new attempt chain: attempt from 0).
    retries: int = 0
    #: [trace] The W3C traceparent of the POST that made it ('' when tracing was off): its retries go on in that trace.
    traceparent: str = ""


@dataclass(frozen=True)
class RejectionReport:
    """The located issues a failed validation kept (at most shipment.MAX_ISSUES,
    in file order) and how many it found: GET /api/imports/{jobId}/rejections.csv."""

    job_id: str
    issues: tuple[CsvIssue, ...]
    found: int

    @property
    def truncated(self) -> bool:
        """True when more issues were found than the report lists."""
        return self.found > len(self.issues)


@dataclass(frozen=True)
class ShipmentRecord:
    """What the durable done marker says about an applied batch."""

    batch_id: str
    owner: str
    applied_at_ms: int
    result: dict[str, object]
    content_sha256: str
    job_id: str
