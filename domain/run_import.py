"""Use case "run imports": contract check, start each attempt, validate, apply, record each outcome.

One way runs N imports, whatever brought them: a queue message of one import
(N = 1, :func:`run_import`), a group message of many (contract version 3), or
fetched messages of one location that share a call (group commit). Read
:func:`run_imports` top to bottom to follow every attempt; every store call is
one atomic step (a Lua script in production).

Each import takes one of two ways through the store:

* **one step**: its upload came with the message and is valid CSV. Start,
  'validated', apply and complete are one atomic call (:func:`apply_together`),
  shared by up to ``together`` such imports of one location, each with its own
  outcome, attempt, fencing token and events;
* **separate steps**: no upload came (a large one, or the transport hands none),
  or it is invalid. Start (which hands over the upload), validate, then apply
  or record the CSV issues.
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
    """What one import's part of a one-step call did (:func:`apply_together`),
    for its own delivery to report."""

    outcome: StartOutcome
    applied: ApplyResult | None
    rows: int


@dataclass(frozen=True)
class Delivery:
    """One import to run, as its queue message brought it.

    ``upload``: the job's upload when it was read with the message (small
    imports), else None. ``ack``: the transport's acknowledgement of that
    message, made inside the one-step call (opaque here; None: none).
    ``settled``: the one-step call already ran for it, shared with another
    delivery (group commit); it is only reported."""

    message: ImportMessage
    upload: bytes | None = None
    ack: Any = None
    settled: Settled | None = None


class PermanentImportFailure(DomainError):
    """Raised once a permanent failure is recorded: the queue must not retry it."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def _ignore_started(job_id: str, attempt: int, token: str) -> None:
    return None


def _ignore_finished(job_id: str) -> None:
    return None


def run_imports(
    store: AttemptStore, deliveries: Sequence[Delivery], *, together: int, max_rows: int, log: EventLog,
    on_started: OnStarted = _ignore_started, on_finished: Callable[[str], None] = _ignore_finished,
) -> list[str | PermanentImportFailure]:
    """Run one attempt of each import, in order, each with its own attempt,
    fencing token, outcome and events; returns, per import, what it did.

    What it did: 'applied' or 'replayed' (the done marker already held the
    result), or the reason the attempt was skipped ('finished', 'stale',
    'missing', 'exhausted', 'busy': a duplicate or late delivery; the record
    already tells the truth), or the :class:`PermanentImportFailure` recorded
    (the CSV is invalid, a conflict, an overflow, the upload gone): retrying
    cannot fix it, and it never stops the others. ``on_started(jobId, attempt,
    token)`` is called when an import's separate steps started its attempt,
    ``on_finished(jobId)`` after each import's end.

    Every write of an attempt carries its fencing token: once a newer attempt
    holds the job (this one's lease ran out), the apply answers 'stale' and
    changes nothing. Anything else raised (the store unreachable, the time
    limit) propagates at once and the queue delivers the message again: each
    import already final is then skipped ('finished', no attempt counted) and
    each other one gets its own attempt. A one-step call is atomic, so none
    of its imports is half done; an import that raised in its separate steps
    has its attempt known to ``on_started`` (and not ``on_finished``), for the
    caller to record its failure.
    """
    outcomes: list[str | PermanentImportFailure] = []
    step = max(1, together)
    for start in range(0, len(deliveries), step):
        chunk = deliveries[start:start + step]
        for delivery, settled in zip(chunk, apply_together(store, chunk, max_rows=max_rows)):
            try:
                did: str | PermanentImportFailure = _run_one(
                    store, delivery.message, settled, max_rows=max_rows, log=log, on_started=on_started,
                )
            except PermanentImportFailure as failure:
                did = failure
            on_finished(delivery.message.job_id)
            outcomes.append(did)
    return outcomes


def run_import(
    store: AttemptStore, body: Any, *, accepted_versions: frozenset[int], max_rows: int, log: EventLog,
    on_started: OnStarted = _ignore_started, upload: bytes | None = None, ack: Any = None, settled: Settled | None = None,
) -> str:
    """:func:`run_imports` of the one import a queue message (contract version
    1 or 2) names: N = 1. Returns what it did; raises the
    :class:`PermanentImportFailure` it recorded, for the queue not to retry
    the message. A message this worker does not accept is recorded as the
    job's permanent failure (import.rejected_message is logged)."""
    msg = decoded(store, body, accepted_versions, log)
    (did,) = run_imports(
        store, [Delivery(msg, upload, ack, settled)], together=1, max_rows=max_rows, log=log, on_started=on_started,
    )
    if isinstance(did, PermanentImportFailure):
        raise did
    return did


def decoded(store: AttemptStore, body: Any, accepted_versions: frozenset[int], log: EventLog) -> ImportMessage:
    """The message a body carries, when this worker accepts its contract
    version; otherwise the job's failure is recorded as permanent and
    :class:`PermanentImportFailure` raised."""
    if isinstance(body, ImportMessage):
        return body
    try:
        return decode_message(body, accepted_versions)
    except DomainError as exc:
        job_id = job_id_of(body)
        log("import.rejected_message", logging.WARNING, jobId=job_id, code=exc.code)
        if job_id:
            store.record_failure(
                job_id=job_id, attempt=None, final=True, error=public_error_for(exc),
                diagnostic=f"{type(exc).__name__}: {exc.detail}", next_attempt_at_ms=None,
            )
        raise PermanentImportFailure(exc.code) from None


def apply_together(store: AttemptStore, deliveries: Sequence[Delivery], *, max_rows: int) -> list[Settled | None]:
    """The one-step call of several deliveries of one location: validate each
    upload and start, apply and complete every valid one in a single atomic
    store call (group commit), each with its own outcome.

    Returns, per delivery in order, what its one-step attempt did (a delivery
    already ``settled`` keeps its outcome), or None for one that takes the
    separate steps: no upload came with it, its upload is invalid CSV, or its
    job is already in the call (a duplicate delivery). Raises what the store
    raises (the store unreachable): then nothing is known of any of them.
    """
    settled: list[Settled | None] = [d.settled for d in deliveries]
    picked: list[tuple[int, int]] = []
    imports: list[OneStepImport] = []
    for position, delivery in enumerate(deliveries):
        msg = delivery.message
        if delivery.settled is not None or delivery.upload is None or any(i.job_id == msg.job_id for i in imports):
            continue
        parsed = parse_shipment(delivery.upload, max_rows=max_rows)
        if isinstance(parsed, CsvInvalid):
            continue  # the separate steps start the attempt, then record the CSV issues
        picked.append((position, parsed.row_count))
        imports.append(OneStepImport(msg.job_id, msg.upload_id, msg.batch_id, parsed, delivery.ack))
    if imports:
        for (position, rows), (outcome, applied) in zip(picked, store.start_and_apply_together(imports)):
            settled[position] = Settled(outcome, applied, rows)
    return settled


def _run_one(
    store: AttemptStore, msg: ImportMessage, settled: Settled | None, *, max_rows: int, log: EventLog, on_started: OnStarted,
) -> str:
    """One import after its one-step call (``settled``: report what it did),
    or by its separate steps (None)."""
    ctx: dict[str, Any] = {"jobId": msg.job_id, "batchId": msg.batch_id}
    if msg.request_id:  # contract version 2: the POST that made the job
        ctx["requestId"] = msg.request_id
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
    # Each import that went as it should is a debug line (IMPORTER_LOG_LEVEL): at
    # info it cost the worker a quarter of its CPU per small import; the job's
    # events, its record and the ledger say it. A replay (sent twice) is shown.
    log("import." + applied.kind, logging.DEBUG if applied.kind == "applied" else logging.INFO, rows=rows, **ctx)
    return applied.kind
