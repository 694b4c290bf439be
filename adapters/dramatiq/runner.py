"""The import actor and the runner it calls: dramatiq's message in, run_import, the attempt remembered."""

from __future__ import annotations

import logging
import os
import time
import traceback
from dataclasses import dataclass
from typing import Any

import dramatiq
from dramatiq.middleware import CurrentMessage
from dramatiq.middleware.time_limit import TimeLimitExceeded

from opentelemetry.trace import SpanKind

from importer.adapters import tracing
from importer.adapters.logs import log_event
from importer.adapters.redis.errors import StoreUnavailable
from importer.adapters.settings import Settings
from importer.domain.ids import request_id_var
from importer.domain.ports import AttemptStore
from importer.domain.contract import decode_group, decode_message, is_group, job_ids_of
from importer.domain.errors import DomainError, public_error_for
from importer.domain.run_import import (
    Delivery, PermanentImportFailure, Settled, apply_together, run_import, run_imports,
)

from importer.adapters.dramatiq.broker import ACTOR_NAME
from importer.adapters.dramatiq.handover import Handed, MessageHandover, Rider

log = logging.getLogger("importer.worker")


def where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" at {os.path.basename(last.filename)}:{last.lineno} in {last.name}"


@dataclass(frozen=True)
class PendingFailure:
    """A failed attempt to record in the job (fail.lua); kept while the store is away."""

    job_id: str
    attempt: int
    token: str
    code: str
    outage: bool
    diagnostic: str
    next_attempt_at_ms: int


class ImportRunner:
    """Runs :func:`importer.domain.run_import.run_import` for the actor and
    remembers which attempt each dramatiq message started (with its fencing
    token), for AttemptRecorder and for the lease renewal of the Reconciler."""

    def __init__(self, store: AttemptStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        # dramatiq message id -> (jobId, attempt, token)
        self._attempts: dict[str, tuple[str, int, str]] = {}
        # Failures not recorded yet (the store was away), by (jobId, token).
        self._pending: dict[tuple[str, str], PendingFailure] = {}

    def attempt_of(self, message_id: str) -> tuple[str, int, str] | None:
        return self._attempts.get(message_id)

    def forget(self, message_id: str) -> None:
        self._attempts.pop(message_id, None)

    def in_flight(self) -> list[tuple[str, str]]:
        """(jobId, token) of every attempt running in this process, or whose
        failure waits to be recorded (their leases are renewed)."""
        running = [(job_id, token) for job_id, _, token in list(self._attempts.values())]
        return running + list(self._pending)

    def keep_pending(self, failure: PendingFailure) -> None:
        self._pending[(failure.job_id, failure.token)] = failure

    def pending(self) -> list[PendingFailure]:
        return list(self._pending.values())

    def drop_pending(self, failure: PendingFailure) -> None:
        self._pending.pop((failure.job_id, failure.token), None)

    def run_group(self, body: Any, message_id: str = "") -> str:
        """A group message (contract version 3): every import it carries, with
        the small uploads read in one round trip, through
        :func:`importer.domain.run_import.run_imports`. The attempt of the import
        running its separate steps is remembered under the message's id, as a
        single message's is, for AttemptRecorder and the lease renewal."""
        try:
            messages = decode_group(body, self.settings.accepted_versions)
        except DomainError as exc:
            job_ids = job_ids_of(body)
            self._log("import.rejected_message", logging.WARNING, jobIds=job_ids, code=exc.code)
            for job_id in job_ids:
                self.store.record_failure(
                    job_id=job_id, attempt=None, final=True, error=public_error_for(exc),
                    diagnostic=f"{type(exc).__name__}: {exc.detail}", next_attempt_at_ms=None,
                )
            raise PermanentImportFailure(exc.code) from None
        # Fault injection (tests) keeps the separate steps: its points sit between them.
        max_bytes = 0 if self.settings.fault else self.settings.one_step_max_bytes
        uploads = self.store.read_small_uploads([(m.job_id, m.upload_id) for m in messages], max_bytes)

        def started(job_id: str, attempt: int, token: str) -> None:
            self._attempts[message_id] = (job_id, attempt, token)

        outcomes = run_imports(
            self.store, [Delivery(m, upload) for m, upload in zip(messages, uploads)],
            together=self.settings.apply_together_max, max_rows=self.settings.max_rows,
            log=self._log, on_started=started, on_finished=lambda _job_id: self.forget(message_id),
        )
        did = [o if isinstance(o, str) else "failed" for o in outcomes]
        self._log("import.group", logging.DEBUG, imports=len(messages), **{d: did.count(d) for d in sorted(set(did))})
        return "group"

    def run(self, body: Any, message_id: str = "", handed: Handed | None = None, handover: MessageHandover | None = None) -> str:
        """``handed``: the upload that came with the message and the ack the
        one-step attempt makes (:class:`MessageHandover`), or the outcome another
        delivery's call gave it. With ``handover``, the attempt takes other
        fetched imports of its location into its call (group commit)."""
        if is_group(body):
            return self.run_group(body, message_id)

        def started(job_id: str, attempt: int, token: str) -> None:
            self._attempts[message_id] = (job_id, attempt, token)

        def run(message: Any = body, **handed_over: Any) -> str:
            return run_import(self.store, message, accepted_versions=self.settings.accepted_versions,
                              max_rows=self.settings.max_rows, log=self._log, on_started=started, **handed_over)

        if handed is None:
            return run()
        if handed.settled is not None:
            return run(settled=handed.settled)
        riders = handover.claim_together(handed) if handover is not None else []
        if not riders:
            return run(upload=handed.upload, ack=handed.ack)
        assert handover is not None
        # This delivery's call takes the riders' imports too (apply_together): one
        # atomic step, each with its own outcome.
        shared = [self._shared(body, handed.upload, handed.ack), *(self._shared(r.body, r.upload, r.ack) for r in riders)]
        settled: list[Settled | None] = [None] * len(shared)
        reported: set[str] = set()
        started_ns = time.time_ns()
        try:
            present = [i for i, d in enumerate(shared) if d is not None]
            deliveries = [d for d in shared if d is not None]
            for i, outcome in zip(present, apply_together(self.store, deliveries, max_rows=self.settings.max_rows)):
                settled[i] = outcome
            for rider, delivery, outcome in zip(riders, shared[1:], settled[1:]):
                if self._report_rider(handover, rider, delivery, outcome, started_ns):
                    reported.add(rider.redis_message_id)
        finally:
            # The others need their own delivery: their actors report the outcome, or run on their own.
            for rider, outcome in zip(riders, settled[1:]):
                if rider.redis_message_id not in reported:
                    handover.give_back(rider.redis_message_id, outcome)
        own = shared[0].message if shared[0] is not None else body
        if settled[0] is not None:
            return run(own, settled=settled[0])
        return run(own, upload=handed.upload, ack=handed.ack)

    def _report_rider(self, handover: MessageHandover, rider: Rider, delivery: Delivery | None, outcome: Settled | None,
                      started_ns: int) -> bool:
        """Report a rider's outcome here, as its own actor would (its log lines under
        its own request id and trace), and finish it: when the call acknowledged its
        message and reporting it needs no store call (a missing upload's failure is
        recorded by its own delivery)."""
        if (delivery is None or outcome is None or outcome.outcome.kind == "upload_missing"
                or not handover.acknowledged(rider.redis_message_id)):
            return False
        options = rider.options or {}
        request_id = request_id_of(rider.body, options)
        token = request_id_var.set(request_id) if request_id else None
        # [trace] its own attempt, as its own delivery's would be, since the call began; linked to its leader's
        attributes = attempt_attributes(rider.message_id, rider.body, options) if tracing.on() else {}
        try:
            with tracing.linked_span("import attempt", SpanKind.CONSUMER, parent=str(options.get("traceparent", "")),
                                     start_ns=started_ns, attributes=attributes):
                try:
                    run_import(self.store, delivery.message, accepted_versions=self.settings.accepted_versions,
                               max_rows=self.settings.max_rows, log=self._log, settled=outcome)
                except PermanentImportFailure:
                    pass  # recorded by the call: a rider is never retried either
        finally:
            if token is not None:
                request_id_var.reset(token)
        handover.finish(rider.redis_message_id)
        return True

    def _shared(self, body: Any, upload: bytes, ack: Any) -> Delivery | None:
        """A fetched delivery for a shared one-step call, or None when this
        worker does not accept its message (its own actor records that)."""
        try:
            return Delivery(decode_message(body, self.settings.accepted_versions), upload, ack)
        except DomainError:
            return None

    @staticmethod
    def _log(event: str, level: int = logging.INFO, **fields: Any) -> None:
        log_event(log, event, level, **fields)


def request_id_of(body: Any, options: dict[str, Any]) -> str | None:
    """The id of the request that sent a message, for its log lines when its body
    does not carry it (a version 1 body has none: the message's option says it)."""
    if isinstance(body, dict) and "requestId" in body:
        return None
    request_id = options.get("requestId")
    return str(request_id) if request_id else None


def attempt_attributes(message_id: str, body: Any, options: dict[str, Any]) -> dict[str, Any]:
    """[trace] The attributes of an ``import attempt`` span, a delivery's or a rider's."""
    return {
        "messaging.system": "dramatiq", "messaging.message.id": message_id,
        "importer.job_id": str(body.get("jobId", "")) if isinstance(body, dict) else "",
        "importer.delivery": int(options.get("retries", 0)) + 1,
    }


def code_for(exc: BaseException) -> str:
    if isinstance(exc, TimeLimitExceeded):
        return "import.time_limit"
    if isinstance(exc, StoreUnavailable):
        return "import.store_unavailable"
    return "import.attempts_exhausted"

def declare_import_actor(broker: dramatiq.Broker, runner: ImportRunner, settings: Settings) -> dramatiq.Actor[Any, None]:
    """The import actor: as thin as a handler, it calls the runner."""
    handover: MessageHandover | None = getattr(broker, "handover", None)

    def import_shipment(body: dict[str, Any]) -> None:
        message = CurrentMessage.get_current_message()
        if message is None:
            runner.run(body)
            return
        request_id = request_id_of(body, message.options)
        token = request_id_var.set(request_id) if request_id else None
        try:
            attempt(body, message)
        finally:
            if token is not None:
                request_id_var.reset(token)

    def attempt(body: dict[str, Any], message: dramatiq.Message[Any]) -> None:
        if not tracing.on():
            runner.run(body, message.message_id, handover.take(message) if handover is not None else None, handover)
            return
        # [trace] one span per delivery, the child of the context its message carries
        with tracing.span("import attempt", SpanKind.CONSUMER, parent=str(message.options.get("traceparent", "")),
                          attributes=attempt_attributes(message.message_id, body, message.options)) as span:
            try:
                runner.run(body, message.message_id, handover.take(message) if handover is not None else None, handover)
            except BaseException as exc:
                tracing.set_error(span, getattr(exc, "code", type(exc).__name__))
                raise

    declare = dramatiq.actor(
        broker=broker,
        actor_name=ACTOR_NAME,
        queue_name=settings.queue_name,
        max_retries=settings.max_attempts - 1,
        min_backoff=settings.min_backoff_ms,
        max_backoff=settings.max_backoff_ms,
        time_limit=int(settings.time_limit_s * 1000),
        throws=(PermanentImportFailure,),
    )
    return declare(import_shipment)
