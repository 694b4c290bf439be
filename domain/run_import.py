"""Use case "run an import": contract check, start the attempt, validate, apply, record the outcome.

The dramatiq actor hands the message body to
:func:`run_import`. Read it top to bottom to follow one attempt; every store
call is one atomic step (a Lua script in production).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from importer.domain.contract import ImportMessage, decode_message, job_id_of
from importer.domain.errors import CsvInvalid, DomainError, PublicError, public_error_for
from importer.domain.ports import (
    ApplyResult, AttemptStore, EventLog, OneStepImport, OnStarted, StartedAttempt, StartOutcome,
)
from importer.domain.shipment import parse_shipment


@dataclass(frozen=True)
class Settled:
    """What one import's part of a one-step call shared with other imports did
    (:func:`apply_together`), for its own delivery to report (:func:`run_import`)."""

    outcome: StartOutcome
    applied: ApplyResult | None
    rows: int


class PermanentImportFailure(DomainError):
    """Raised once a permanent failure is recorded: the queue must not retry it."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def _ignore_started(job_id: str, attempt: int, token: str) -> None:
    return None


def run_import(
    store: AttemptStore,
    body: Any,
    *,
    accepted_versions: frozenset[int],
    max_rows: int,
    log: EventLog,
    on_started: OnStarted = _ignore_started,
    upload: bytes | None = None,
    ack: Any = None,
    settled: Settled | None = None,
) -> str:
    """Run one attempt of the import a queue message names; returns what it did.

    Returns 'applied' or 'replayed' (the done marker already held the result),
    or the reason the attempt was skipped ('finished', 'stale', 'missing',
    'exhausted', 'busy': a duplicate or late delivery; the record already tells
    the truth). Every write of the attempt carries its fencing token: once a
    newer attempt holds the job (this one's lease ran out), the apply answers
    'stale' and changes nothing.

    ``upload``: the job's upload when the queue delivered it with the message
    (small imports). It is parsed and validated first; a valid shipment then
    starts, applies and completes in one atomic step of the store (the
    'validated' milestone is recorded in it, with the events of the separate
    steps); ``ack``, the transport's acknowledgement of that message, is made
    in the same step. ``settled``: that step already ran for this delivery,
    in a call shared with other imports (:func:`apply_together`); this reports
    its outcome. Without an upload, or when it is invalid, the separate steps run: start
    (which hands over the upload), validate, then apply. Raises :class:`PermanentImportFailure` after recording a failure
    that retrying cannot fix. Any other exception (the store unreachable, the
    time limit) propagates to the queue, which retries the attempt.
    """
    try:
        msg = body if isinstance(body, ImportMessage) else decode_message(body, accepted_versions)
    except DomainError as exc:
        job_id = job_id_of(body)
        log("import.rejected_message", logging.WARNING, jobId=job_id, code=exc.code)
        if job_id:
            store.record_failure(
                job_id=job_id, attempt=None, final=True, error=public_error_for(exc),
                diagnostic=f"{type(exc).__name__}: {exc.detail}", next_attempt_at_ms=None,
            )
        raise PermanentImportFailure(exc.code) from None

    ctx: dict[str, Any] = {"jobId": msg.job_id, "batchId": msg.batch_id}
    if msg.request_id:  # contract version 2: the POST that made the job
        ctx["requestId"] = msg.request_id
    if settled is None and upload is not None:
        parsed = parse_shipment(upload, max_rows=max_rows)
        # An invalid upload takes the separate steps below: the attempt starts,
        # then its failure is recorded with the CSV issues.
        if not isinstance(parsed, CsvInvalid):
            outcome, applied = store.start_and_apply(
                job_id=msg.job_id, upload_id=msg.upload_id, batch_id=msg.batch_id, shipment=parsed, ack=ack,
            )
            settled = Settled(outcome, applied, parsed.row_count)
    if settled is not None:
        started = _started(store, settled.outcome, msg.job_id, log, ctx)
        if started is None or settled.applied is None:
            return settled.outcome.kind
        ctx.update(owner=started.owner, attempt=started.attempt)
        log("import.started", logging.DEBUG, **ctx)
        return _applied(settled.applied, settled.rows, log, ctx)

    outcome = store.start_attempt(msg.job_id, msg.upload_id)
    started = _started(store, outcome, msg.job_id, log, ctx)
    if started is None:
        return outcome.kind
    ctx.update(owner=started.owner, attempt=started.attempt)
    on_started(msg.job_id, started.attempt, started.token)
    log("import.started", logging.DEBUG, **ctx)

    parsed = parse_shipment(started.csv, max_rows=max_rows)
    if isinstance(parsed, CsvInvalid):
        store.record_failure(
            job_id=msg.job_id, attempt=started.attempt, final=True, error=public_error_for(parsed),
            diagnostic=f"{parsed.found} CSV issue(s) ({len(parsed.issues)} kept), first {parsed.code}", next_attempt_at_ms=None,
            token=started.token,
        )
        log("import.failed", code=parsed.code, issues=parsed.found, **ctx)
        raise PermanentImportFailure(parsed.code)

    applied = store.validated_and_apply(
        job_id=msg.job_id, upload_id=msg.upload_id, attempt=started.attempt,
        batch_id=msg.batch_id, owner=started.owner, shipment=parsed, token=started.token,
    )
    return _applied(applied, parsed.row_count, log, ctx)


def apply_together(
    store: AttemptStore, deliveries: Sequence[tuple[Any, bytes, Any]], *, accepted_versions: frozenset[int], max_rows: int,
) -> list[Settled | None]:
    """Validate several deliveries of one location (message body, the upload
    that came with it, the ack of its message) and run the one-step attempt of
    every valid one in a single atomic store call (group commit).

    Returns, per delivery in order, what its attempt did, or None for a
    delivery to run on its own with :func:`run_import` (which then records what
    is wrong): its message is not one this worker accepts, its upload is
    invalid CSV, or its job is already in the call (a duplicate delivery).
    Raises what the store raises (the store unreachable): then nothing is
    known of any of them, and each delivery runs on its own.
    """
    settled: list[Settled | None] = [None] * len(deliveries)
    picked: list[tuple[int, int]] = []
    imports: list[OneStepImport] = []
    for position, (body, upload, ack) in enumerate(deliveries):
        try:
            msg = body if isinstance(body, ImportMessage) else decode_message(body, accepted_versions)
        except DomainError:
            continue
        if any(i.job_id == msg.job_id for i in imports):
            continue
        parsed = parse_shipment(upload, max_rows=max_rows)
        if isinstance(parsed, CsvInvalid):
            continue
        picked.append((position, parsed.row_count))
        imports.append(OneStepImport(msg.job_id, msg.upload_id, msg.batch_id, parsed, ack))
    if imports:
        for (position, rows), (outcome, applied) in zip(picked, store.start_and_apply_together(imports)):
            settled[position] = Settled(outcome, applied, rows)
    return settled


def run_group(
    store: AttemptStore, messages: Sequence[ImportMessage], uploads: Sequence[bytes | None], *, together: int,
    max_rows: int, log: EventLog, on_started: OnStarted = _ignore_started,
    on_finished: Callable[[str], None] = lambda job_id: None,
) -> list[str]:
    """Run every import one group message carries (contract version 3), in
    order, each with its own attempt, fencing token, outcome and events.

    ``uploads``: each import's upload when it was read with the message (small
    ones), else None. The imports with a valid upload run in calls of up to
    ``together`` (:func:`apply_together`: one atomic step each, start to
    completed); every other one (no upload read, invalid CSV, its job twice)
    takes the separate steps of :func:`run_import`, which records what is
    wrong. Returns, per import, what :func:`run_import` returns, or 'failed'
    for a failure recorded as permanent (it never stops the others);
    ``on_finished(jobId)`` is called after each such end.

    Anything else raised (the store unreachable, the time limit) propagates
    at once: the queue delivers the whole message again, where each import
    already final is skipped ('finished': no attempt counted) and each other
    one gets its own attempt. A one-step call is atomic, so none of its
    imports is half done; an import that raised in its separate steps has its
    attempt known to ``on_started`` (and not ``on_finished``), for the caller
    to record its failure.
    """
    outcomes: list[str] = []
    for start in range(0, len(messages), max(1, together)):
        chunk = list(zip(messages[start:start + together], uploads[start:start + together]))
        read = [position for position, (_, upload) in enumerate(chunk) if upload is not None]
        settled: list[Settled | None] = [None] * len(chunk)
        if read:
            together_settled = apply_together(
                store, [(chunk[p][0], chunk[p][1] or b"", None) for p in read], accepted_versions=frozenset(), max_rows=max_rows,
            )
            for position, outcome in zip(read, together_settled):
                settled[position] = outcome
        for (msg, _), outcome in zip(chunk, settled):
            try:
                did = run_import(store, msg, accepted_versions=frozenset(), max_rows=max_rows, log=log,
                                 on_started=on_started, settled=outcome)
            except PermanentImportFailure:
                did = "failed"
            on_finished(msg.job_id)
            outcomes.append(did)
    return outcomes


def _started(store: AttemptStore, outcome: StartOutcome, job_id: str, log: EventLog, ctx: dict[str, Any]) -> StartedAttempt | None:
    """The attempt that started, or None when this delivery has nothing to do (logged)."""
    if outcome.kind == "upload_missing":
        store.record_failure(
            job_id=job_id, attempt=outcome.attempt, final=True,
            error=PublicError.from_code("import.upload_missing"), diagnostic="upload key missing",
            next_attempt_at_ms=None,
        )
        raise PermanentImportFailure("import.upload_missing")
    if outcome.kind != "started" or outcome.started is None:
        log("import.skipped", reason=outcome.kind, state=outcome.state, **ctx)
        return None
    return outcome.started


def _applied(applied: ApplyResult, rows: int, log: EventLog, ctx: dict[str, Any]) -> str:
    if applied.kind in ("conflict", "overflow"):
        # The apply script recorded the failure in the same atomic step.
        code = "batch.conflict" if applied.kind == "conflict" else "stock.overflow"
        log("import.failed", code=code, **ctx)
        raise PermanentImportFailure(code)
    if applied.kind == "stale":
        log("import.fenced", logging.WARNING, state=applied.detail, **ctx)
        return "stale"
    log("import." + applied.kind, rows=rows, **ctx)
    return applied.kind
