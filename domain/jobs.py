"""The job record as the API shows it: a plain value, built from storage by an adapter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

JobState = Literal["waiting", "active", "retrying", "completed", "failed"]
FINISHED_STATES = frozenset({"completed", "failed"})


@dataclass(frozen=True)
class JobRecord:
    id: str
    batch_id: str
    owner: str
    state: str
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

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES


@dataclass(frozen=True)
class ShipmentRecord:
    """What the durable done marker says about an applied batch."""

    batch_id: str
    owner: str
    applied_at_ms: int
    result: dict[str, object]
    content_sha256: str
    job_id: str
