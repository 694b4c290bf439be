"""The dramatiq side: the broker, its middleware, the import actor, the producer.

dramatiq's defaults are not this service's, so every option is set here:

* Retries: dramatiq retries 20 times from 15 s on. An import gets 3 attempts
  in total (max_retries=2) with exponential backoff from 1 s, because a
  person is watching it and its transient causes (Redis blip, time limit)
  either clear within seconds or need a human.
* TimeLimit: dramatiq allows 10 minutes. One attempt gets 60 s by default
  (IMPORTER_TIME_LIMIT): the largest allowed file validates and applies in
  well under a second, so a minute means something is stuck.
* Heartbeat timeout: dramatiq waits 60 s before a dead worker's messages are
  redelivered. 15 s by default (IMPORTER_HEARTBEAT_TIMEOUT): a redelivered
  import is harmless (the done marker), a stalled one is what users see.
* Maintenance chance: how often the broker looks for dead workers; dramatiq's
  default leaves a dead worker's message alone for minutes on an idle queue.
* Permanent failures (invalid CSV, unsupported contract version, conflict,
  overflow) are in the actor's ``throws``: recorded as failed, never retried.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage, Middleware, Retries, ShutdownNotifications, TimeLimit
from dramatiq.middleware.time_limit import TimeLimitExceeded

from importer.adapters.logs import log_event
from importer.adapters.redis_store import RedisStore, StoreUnavailable, unavailable
from importer.adapters.settings import Settings
from importer.domain.contract import encode_message
from importer.domain.errors import PublicError
from importer.domain.ports import AttemptStore
from importer.domain.run_import import PermanentImportFailure, run_import

ACTOR_NAME = "import_shipment"
log = logging.getLogger("importer.worker")


def build_broker(settings: Settings, client: Any, *, worker_middleware: list[Middleware] | None = None) -> dramatiq.Broker:
    """The broker with its middleware declared explicitly (no global broker).

    The transport is configuration only (IMPORTER_BROKER_URL): Redis by
    default (the store's own Redis), or RabbitMQ with publisher confirms, so a
    POST answers 202 only once RabbitMQ has stored the message. Nothing else in
    the code base depends on which one it is.
    """
    middleware: list[Middleware] = [
        TimeLimit(time_limit=int(settings.time_limit_s * 1000), interval=100),
        ShutdownNotifications(notify_shutdown=False),
        CurrentMessage(),
        Retries(
            max_retries=settings.max_attempts - 1,
            min_backoff=settings.min_backoff_ms,
            max_backoff=settings.max_backoff_ms,
        ),
        # dramatiq runs after_* hooks in reverse order: listed after Retries,
        # AttemptRecorder sees the retry count of the attempt that failed,
        # before Retries increments it.
        *(worker_middleware or []),
    ]
    url = settings.broker_url
    if url and url.startswith(("amqp://", "amqps://")):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=_with_amqp_timeouts(url), confirm_delivery=True, middleware=middleware)
    return RedisBroker(
        client=client if not url else None,
        url=url,
        namespace=f"{settings.key_prefix}dramatiq",
        middleware=middleware,
        heartbeat_timeout=int(settings.heartbeat_timeout_s * 1000),
        maintenance_chance=settings.maintenance_chance,
        dead_message_ttl=86_400_000,
    )


def _with_amqp_timeouts(url: str) -> str:
    """Bound every wait on RabbitMQ (a blocked or silent broker must not hang a POST)."""
    if "?" in url:
        return url
    return url + "?socket_timeout=10&blocked_connection_timeout=10&connection_attempts=2&retry_delay=1"


class ImportQueue:
    """Producer side: sends the versioned message for a recorded job."""

    def __init__(self, broker: dramatiq.Broker, settings: Settings) -> None:
        self.broker = broker
        self.settings = settings

    def send(self, *, job_id: str, batch_id: str, upload_id: str) -> None:
        body = encode_message(job_id, batch_id, upload_id, version=self.settings.producer_version)
        self.send_raw(body)

    def send_raw(self, body: dict[str, Any]) -> None:
        """Send any body, valid or not (tests use it to send a v2 message).

        Any failure of the broker or of its Redis (refused, timed out, out of
        memory, read-only...) is StoreUnavailable: HTTP answers 503 and the
        reconciler sends the message of the recorded job later.
        """
        message = dramatiq.Message(
            queue_name=self.settings.queue_name, actor_name=ACTOR_NAME, args=(body,), kwargs={}, options={}
        )
        try:
            self.broker.enqueue(message)
        except dramatiq.errors.BrokerError as exc:  # RabbitMQ: connection closed, publish not confirmed
            raise StoreUnavailable(f"broker: {type(exc).__name__}") from exc
        except redis.RedisError as exc:
            translated = unavailable(exc)
            if translated is None:
                raise
            raise translated from exc


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" at {os.path.basename(last.filename)}:{last.lineno} in {last.name}"


class ImportRunner:
    """Runs :func:`importer.domain.run_import.run_import` for the actor and
    remembers which attempt each dramatiq message started, for AttemptRecorder."""

    def __init__(self, store: AttemptStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self._attempts: dict[str, tuple[str, int]] = {}  # dramatiq message id -> (jobId, attempt)

    def attempt_of(self, message_id: str) -> tuple[str, int] | None:
        return self._attempts.get(message_id)

    def forget(self, message_id: str) -> None:
        self._attempts.pop(message_id, None)

    def run(self, body: Any, message_id: str = "") -> str:
        def started(job_id: str, attempt: int) -> None:
            self._attempts[message_id] = (job_id, attempt)

        return run_import(
            self.store, body, accepted_versions=self.settings.accepted_versions, max_rows=self.settings.max_rows,
            log=lambda event, level=logging.INFO, **fields: log_event(log, event, level, **fields),
            on_started=started,
        )


def _code_for(exc: BaseException) -> str:
    if isinstance(exc, TimeLimitExceeded):
        return "import.time_limit"
    if isinstance(exc, StoreUnavailable):
        return "import.store_unavailable"
    return "import.attempts_exhausted"


class AttemptRecorder(Middleware):
    """Writes 'retrying' or 'failed' into the job record when an attempt raised.

    Permanent failures are recorded by the runner itself (with their CSV
    issues). The traceback goes to the log and a one-line diagnostic to the
    record's operator-only field; the API shows only the code.
    """

    def __init__(self, runner: ImportRunner, settings: Settings) -> None:
        self.runner = runner
        self.settings = settings

    def after_process_message(self, broker: Any, message: Any, *, result: Any = None, exception: BaseException | None = None) -> None:
        known = self.runner.attempt_of(message.message_id)
        self.runner.forget(message.message_id)
        if exception is None or isinstance(exception, PermanentImportFailure) or known is None:
            return
        job_id, attempt = known
        retries_done = message.options.get("retries", 0)
        final = retries_done >= self.settings.max_attempts - 1 or attempt >= self.settings.max_attempts
        code = _code_for(exception)
        backoff = min(self.settings.min_backoff_ms * (2**retries_done), self.settings.max_backoff_ms)
        diagnostic = f"{type(exception).__name__}: {exception}{_where(exception)}"
        log_event(
            log, "import.attempt_failed", logging.WARNING, jobId=job_id, attempt=attempt, code=code,
            final=final, exc_info=(type(exception), exception, exception.__traceback__),
        )
        try:
            self.runner.store.record_failure(
                job_id=job_id, attempt=attempt, final=final, error=PublicError.from_code(code),
                diagnostic=diagnostic, next_attempt_at_ms=None if final else int(time.time() * 1000) + backoff,
            )
        except StoreUnavailable:
            log_event(log, "import.record_failure_lost", logging.ERROR, jobId=job_id, attempt=attempt)

    def after_skip_message(self, broker: Any, message: Any) -> None:
        self.runner.forget(message.message_id)


class UnsentSweeper(Middleware):
    """Sends the message of any job recorded but never confirmed sent.

    The HTTP process records the job, sends its message, then marks it sent.
    If it dies in between, this sweeper (one thread per worker process, one
    active sweep at a time thanks to a Redis lock) sends the message after
    IMPORTER_UNSENT_GRACE seconds. Sending twice is harmless: start.lua skips
    finished jobs and the done marker stops a second addition.
    """

    def __init__(self, store: RedisStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.queue: ImportQueue | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        self.queue = ImportQueue(broker, self.settings)
        self._thread = threading.Thread(target=self._loop, name="importer-sweeper", daemon=True)
        self._thread.start()

    def before_worker_shutdown(self, broker: Any, worker: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.sweep_interval_s):
            try:
                self.sweep_once()
            except StoreUnavailable:
                log_event(log, "sweeper.store_unavailable", logging.WARNING)
            except Exception:  # never let the sweeper thread die
                log.exception("sweeper.error")

    def sweep_once(self) -> int:
        lock = f"{self.settings.key_prefix}sweeper:lock"
        if not self.store.client.set(lock, os.getpid(), nx=True, px=int(self.settings.sweep_interval_s * 1000)):
            return 0
        cutoff = int(time.time() * 1000) - int(self.settings.unsent_grace_s * 1000)
        sent = 0
        for job_id, batch_id, upload_id in self.store.unsent_before(cutoff):
            assert self.queue is not None  # set at worker boot, before the loop starts
            self.queue.send(job_id=job_id, batch_id=batch_id, upload_id=upload_id)
            self.store.mark_sent(job_id)
            log_event(log, "sweeper.resent", jobId=job_id, batchId=batch_id)
            sent += 1
        return sent


def declare_import_actor(broker: dramatiq.Broker, runner: ImportRunner, settings: Settings) -> dramatiq.Actor:
    """The import actor: as thin as a handler, it calls the runner."""
    def import_shipment(body: dict[str, Any]) -> None:
        message = CurrentMessage.get_current_message()
        runner.run(body, message.message_id if message is not None else "")

    return dramatiq.actor(
        import_shipment,
        broker=broker,
        actor_name=ACTOR_NAME,
        queue_name=settings.queue_name,
        max_retries=settings.max_attempts - 1,
        min_backoff=settings.min_backoff_ms,
        max_backoff=settings.max_backoff_ms,
        time_limit=int(settings.time_limit_s * 1000),
        throws=(PermanentImportFailure,),
    )


class CloseConnections(Middleware):
    """Closes the worker process's Redis connections after dramatiq has stopped
    its worker threads (in-flight imports finished or the shutdown deadline
    passed) and its consumers: never before."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def after_worker_shutdown(self, broker: Any, worker: Any) -> None:
        self.client.close()
        log_event(log, "worker.redis_closed")
