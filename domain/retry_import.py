"""Use case "retry a failed import": a new attempt chain under the same job id.

The owner of a failed import asks for it to run again (``POST
/api/imports/{jobId}/retry``, the console's Retry button, ``importer
retry``). One atomic step of the store checks and records the retry; the
message is written in that step (the Redis transport) or sent after it, as
:func:`importer.domain.submit_import.submit_import` does.

Which failures a retry can change is decided here, once (:data:`RETRYABLE_CODES`
and :func:`retry_refusal`): the store's script gets the same list. A retry
never applies a shipment twice: the new attempts go through the same apply
step, whose done marker returns the stored result (a replay) when the batch
was in fact applied.
"""

from __future__ import annotations

from importer.domain.errors import JobNotFound, NotRetryable, NoWorkerAccepts
from importer.domain.jobs import JobState
from importer.domain.ports import MessageSender, RetryStore
from importer.domain.submit_import import Accepted

#: The failure codes a retry can change: the causes were outside the file
#: (a worker, the store, the clock, the workers' contract versions, a bad
#: message) and may be gone now. Anything else (a CSV issue, a conflict, an
#: overflow, a lost upload, a code this list does not know) is refused:
#: the same bytes would meet the same fate.
RETRYABLE_CODES = frozenset({
    "import.attempts_exhausted",
    "import.time_limit",
    "import.store_unavailable",
    "import.worker_lost",
    "import.stalled",
    "contract.unsupported_version",
    "contract.invalid_message",
})

#: Why a retry is refused, as the store's script reports it (RetryOutcome.reason).
REASON_STATE = "state"    # the import is not failed
REASON_CODE = "code"      # it failed for a reason a retry cannot change
REASON_UPLOAD = "upload_gone"  # its stored upload is gone

_NOT_FAILED = {
    "waiting": "it waits for a worker and runs by itself (a retry that was answered 503 may have been recorded)",
    "active": "it is running now",
    "retrying": "it will be tried again by itself",
    "completed": "its shipment is applied, once, and there is nothing to retry",
}

_PERMANENT = {
    "batch.conflict": (
        "its batchId is bound to other content or another producer for good, so a retry would fail the same way. "
        "Send the shipment under a new batchId."
    ),
    "stock.overflow": (
        "stock only grows, so a SKU that would have gone above the maximum still would. "
        "Send smaller quantities under a new batchId."
    ),
    "import.upload_missing": (
        "its stored file is gone, so there is nothing to run again. Send the file again under a new batchId."
    ),
}


def is_retryable_code(code: str | None) -> bool:
    return code in RETRYABLE_CODES


def retry_refusal(state: str, error_code: str | None, *, upload_kept: bool = True) -> tuple[str, str] | None:
    """Why a retry of an import in ``state`` that failed with ``error_code``
    is refused: (reason, the sentence a person reads), or None when it may
    go on. Checked in this order: the state, the failure's code, the upload."""
    if state != JobState.FAILED:
        why = _NOT_FAILED.get(state, "only a failed one can be retried")
        return REASON_STATE, f"Only a failed import can be retried; this one is {state}: {why}."
    code = error_code or "unknown"
    if not is_retryable_code(error_code):
        if code.startswith("csv."):
            return REASON_CODE, (
                f"This import failed CSV validation ({code}): the same bytes give the same issues, so a retry "
                "would fail the same way. Fix the file and send it under a new batchId."
            )
        why = _PERMANENT.get(code, "a retry cannot change that.")
        return REASON_CODE, f"This import failed with {code}: {why}"
    if not upload_kept:
        return REASON_UPLOAD, (
            "This import's stored file is no longer kept, so there is nothing to run again. "
            "Send the file again under a new batchId."
        )
    return None


def retry_import(store: RetryStore, sender: MessageSender, *, job_id: str, owner: str, upload_id: str) -> Accepted:
    """Retry the owner's failed import ``job_id``: its record starts a new
    attempt chain (state waiting, attempts from 0, error cleared, its upload
    kept under ``upload_id``) and its message is queued.

    Raises :class:`JobNotFound` for a missing record and for another
    owner's alike, :class:`NotRetryable` with the reason otherwise refused,
    :class:`NoWorkerAccepts` when live workers exist and none accepts the
    producer's contract version (the door check of a new job; nothing changed).
    On the Redis transport the store writes the message in the same atomic
    step; otherwise it is sent after, and the job is marked sent (a send
    that fails leaves the job in the unsent index: the reconciler sends it).
    """
    outcome = store.retry_job(job_id=job_id, owner=owner, upload_id=upload_id, retryable=RETRYABLE_CODES)
    if outcome.kind == "missing":
        raise JobNotFound()
    if outcome.kind == "not_retryable":
        refusal = retry_refusal(
            outcome.state, outcome.error_code or None, upload_kept=outcome.reason != REASON_UPLOAD,
        )
        detail = refusal[1] if refusal is not None else "This import cannot be retried now."
        raise NotRetryable(detail, state=outcome.state, error_code=outcome.error_code)
    if outcome.kind == "no_worker":
        raise NoWorkerAccepts(outcome.producer_version, outcome.workers_accept)
    if not outcome.sent:
        sender.send(job_id=job_id, batch_id=outcome.batch_id, upload_id=upload_id)
        store.mark_sent(job_id)
    return Accepted(job_id, outcome.batch_id, JobState.WAITING)
