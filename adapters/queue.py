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

import json
import logging
import os
import threading
import time
import traceback
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import current_millis
from dramatiq.middleware import CurrentMessage, Middleware, Retries, ShutdownNotifications, TimeLimit
from dramatiq.middleware.time_limit import TimeLimitExceeded

from importer.adapters.logs import log_event
from importer.adapters.redis_store import (
    Keys,
    OutgoingMessage,
    QueueAck,
    RedisStore,
    StoreUnavailable,
    store_errors,
    unavailable,
)
from importer.adapters.scripts import fetch_source
from importer.adapters.settings import Settings
from importer.domain.contract import encode_message
from importer.domain.errors import PublicError
from importer.domain.ports import AttemptStore
from importer.domain.run_import import PermanentImportFailure, run_import
from importer.handlers.http import request_id_var
from importer.handlers.ids import random_uuid

ACTOR_NAME = "import_shipment"
log = logging.getLogger("importer.worker")


def build_broker(
    settings: Settings, client: Any, *, worker_middleware: list[Middleware] | None = None,
    recorder: Middleware | None = None,
) -> dramatiq.Broker:
    """The broker with its middleware declared explicitly (no global broker).

    The transport is configuration only (IMPORTER_BROKER_URL): Redis by
    default (the store's own Redis), or RabbitMQ with publisher confirms, so a
    POST answers 202 only once RabbitMQ has stored the message. Nothing else in
    the code base depends on which one it is.
    """
    # dramatiq runs before_* hooks in list order and after_* hooks in reverse.
    # TimeLimit is listed last: it arms the attempt's timer right before the
    # actor and disarms it first after it, so no after_* hook (the retry's
    # enqueue, the failure write) runs under the timer. Before, a hook blocked
    # on a stopped Redis (a socket timeout long) was hit by TimeLimit's
    # asynchronous exception, which killed the dramatiq worker thread while
    # its consumer kept fetching messages nobody ran (fault suite, Redis
    # SIGSTOP). The recorder (AttemptRecorder) is listed first: it runs last.
    middleware: list[Middleware] = [
        *([recorder] if recorder is not None else []),
        ShutdownNotifications(notify_shutdown=False),
        CurrentMessage(),
        Retries(
            max_retries=settings.max_attempts - 1,
            min_backoff=settings.min_backoff_ms,
            max_backoff=settings.max_backoff_ms,
        ),
        *(worker_middleware or []),
        TimeLimit(time_limit=int(settings.time_limit_s * 1000), interval=100),
    ]
    url = settings.broker_url
    if url and url.startswith(("amqp://", "amqps://")):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=_with_amqp_timeouts(url), confirm_delivery=True, middleware=middleware)
    keys = Keys(settings.key_prefix)
    # The uploads come with their messages only when the broker's Redis is the
    # store's (one script reads both). Fault injection (tests) keeps the
    # separate steps: its points sit between them.
    one_step = 0 if url or settings.fault else settings.one_step_max_bytes
    return ImporterRedisBroker(
        client=client if not url else None,
        url=url,
        namespace=keys.dramatiq,
        middleware=middleware,
        heartbeat_timeout=int(settings.heartbeat_timeout_s * 1000),
        maintenance_chance=settings.maintenance_chance,
        dead_message_ttl=86_400_000,
        handover=MessageHandover(settings.queue_name, keys.upload(""), one_step),
    )


class MessageHandover:
    """What dramatiq's consumer hands the import actor beside a message, and back.

    * Small uploads: the fetch (fetch.lua) brings the upload of each fetched
      import message of at most ``max_bytes`` with it, kept here by the
      message's ``redis_message_id`` until the actor takes it. The actor then
      parses and validates it first and runs the attempt as one script
      (start_apply.lua), which also acknowledges the message.
    * Acknowledged by the script: those messages' ids, so that the consumer
      skips dramatiq's own ack (one round trip and one script call fewer per import).

    Shared by the consumer thread and the worker threads of one process (dict
    and set operations are atomic under the GIL).
    """

    #: A bound on uploads kept for messages no actor took (a consumer closed
    #: with messages in its cache, a message of a removed job...).
    MAX_KEPT = 10_000

    def __init__(self, queue_name: str, upload_prefix: str, max_bytes: int) -> None:
        self.queue_name = queue_name
        self.upload_prefix = upload_prefix
        self.max_bytes = max_bytes
        self.namespace = ""
        self.worker_id = ""
        self._uploads: dict[str, bytes] = {}
        self._acked: set[str] = set()

    def keep(self, redis_message_ids: list[Any], uploads: list[bytes]) -> None:
        if len(self._uploads) > self.MAX_KEPT:
            self._uploads.clear()  # the actor then takes the separate steps: nothing is lost
        for rid, upload in zip(redis_message_ids, uploads):
            self._uploads[rid.decode() if isinstance(rid, bytes) else rid] = upload

    def drop(self, redis_message_ids: list[str]) -> None:
        for rid in redis_message_ids:
            self._uploads.pop(rid, None)

    def take(self, message: Any) -> tuple[bytes, QueueAck] | None:
        """The upload that came with this message and the ack the script makes, or None."""
        rid = message.options.get("redis_message_id") if message is not None else None
        upload = self._uploads.pop(rid, None) if rid else None
        if upload is None:
            return None
        queue = f"{self.namespace}:{self.queue_name}"
        return upload, QueueAck(
            acks_key=f"{self.namespace}:__acks__.{self.worker_id}.{self.queue_name}",
            messages_key=f"{queue}.msgs", heartbeats_key=f"{self.namespace}:__heartbeats__",
            redis_message_id=rid, worker_id=self.worker_id, acknowledged=lambda: self._acked.add(rid),
        )

    def acked_by_script(self, message: Any) -> bool:
        rid = message.options.get("redis_message_id")
        if rid in self._acked:
            self._acked.discard(rid)
            return True
        return False


class _SafeRequeueConsumer(_RedisConsumer):
    """dramatiq's Redis consumer, whose requeue never raises, and which skips
    the ack of a message that the import's own script acknowledged.

    When a fetch fails for anything but a ConnectionError (a timeout, a full
    Redis), dramatiq's consumer thread closes the consumer, which requeues its
    prefetched messages; when that fails too, the exception escapes the
    thread and the thread is gone for good: this process never consumes that
    queue again (fault suite, Redis full). Here the failed requeue is logged
    and the messages stay in this worker's acks set, where the reconciler
    covers them (deadlines; stranded acks of finished jobs dropped).
    """

    def requeue(self, messages: Any) -> None:
        messages = list(messages)
        self.broker.handover.drop([m.options.get("redis_message_id") for m in messages])
        try:
            super().requeue(messages)
        except redis.RedisError as exc:
            log_event(log, "worker.requeue_failed", logging.WARNING, queue=self.queue_name, error=type(exc).__name__)

    def ack(self, message: Any) -> None:
        if self.broker.handover.acked_by_script(message):
            self.queued_message_ids.discard(message.message_id)
            return
        super().ack(message)

    def nack(self, message: Any) -> None:
        self.broker.handover.acked_by_script(message)  # forget it; dramatiq's nack of it is then a no-op
        super().nack(message)


class ImporterRedisBroker(RedisBroker):
    """dramatiq's Redis broker with :class:`_SafeRequeueConsumer`, whose fetch
    brings small uploads with their messages (:class:`MessageHandover`)."""

    def __init__(self, *, handover: MessageHandover, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        handover.namespace = self.namespace
        handover.worker_id = self.broker_id
        self.handover = handover
        self._fetch = self.client.register_script(fetch_source())

    @property
    def consumer_class(self) -> Any:
        return _SafeRequeueConsumer

    def do_fetch(self, queue_name: str, prefetch: int) -> list[Any]:
        """dramatiq's fetch (its dispatch script, run by fetch.lua), plus the small uploads."""
        h = self.handover
        if h.max_bytes <= 0 or queue_name != h.queue_name:
            return self._dispatch("fetch")(queue_name, prefetch)  # type: ignore[no-any-return]
        messages, ids, uploads = self._fetch(
            keys=[self.namespace],
            args=[
                "fetch", current_millis(), queue_name, self.broker_id, self.heartbeat_timeout,
                self.dead_message_ttl, self._should_do_maintenance("fetch"), self._max_unpack_size(), prefetch,
                h.upload_prefix, h.max_bytes, ACTOR_NAME,
            ],
        )
        if ids:
            h.keep(ids, uploads)
        return messages  # type: ignore[no-any-return]


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
        self.send_raw(self._body(job_id, batch_id, upload_id))

    def _body(self, job_id: str, batch_id: str, upload_id: str) -> dict[str, Any]:
        # A version 2 message carries the request id of the POST that made the job (none outside a request).
        return encode_message(
            job_id, batch_id, upload_id, version=self.settings.producer_version, request_id=request_id_var.get()
        )

    def _message(self, body: dict[str, Any]) -> dramatiq.Message[Any]:
        return dramatiq.Message(
            queue_name=self.settings.queue_name, actor_name=ACTOR_NAME, args=(body,), kwargs={}, options={}
        )

    def send_raw(self, body: dict[str, Any]) -> None:
        """Send any body, valid or not (tests use it to send a v2 message).

        Any failure of the broker or of its Redis (refused, timed out, out of
        memory, read-only...) is StoreUnavailable: HTTP answers 503 and the
        reconciler sends the message of the recorded job later.
        """
        try:
            self.broker.enqueue(self._message(body))
        except dramatiq.errors.BrokerError as exc:  # RabbitMQ: connection closed, publish not confirmed
            raise StoreUnavailable(f"broker: {type(exc).__name__}") from exc
        except redis.RedisError as exc:
            translated = unavailable(exc)
            if translated is None:
                raise
            raise translated from exc

    def writes_to(self, client: Any) -> bool:
        """Whether the broker is dramatiq's Redis broker on this very client, so
        the store can write the message in the script that records the job."""
        return isinstance(self.broker, RedisBroker) and self.broker.client is client

    def redis_message(self, job_id: str, batch_id: str, upload_id: str) -> OutgoingMessage:
        """The message exactly as ``RedisBroker.enqueue`` writes it (no delay):
        a copy with a fresh ``redis_message_id`` option, encoded by dramatiq's
        encoder, stored under that id in ``<namespace>:<queue>.msgs`` and the id
        pushed on ``<namespace>:<queue>``. dramatiq's enqueue middleware hooks
        are not run: no middleware of the producer's broker has any."""
        assert isinstance(self.broker, RedisBroker)
        redis_message_id = random_uuid()
        # dramatiq.Message(...).copy(options=...).encode(), without building the
        # two dataclasses (a tenth of a POST's Python time): the same fields, in
        # the same order, through dramatiq's own (global) encoder.
        fields = {
            "queue_name": self.settings.queue_name,
            "actor_name": ACTOR_NAME,
            "args": [self._body(job_id, batch_id, upload_id)],
            "kwargs": {},
            "options": {"redis_message_id": redis_message_id},
            "message_id": random_uuid(),  # dramatiq's generate_unique_id(), without its syscall
            "message_timestamp": int(time.time() * 1000),
        }
        queue_key = f"{self.broker.namespace}:{self.settings.queue_name}"
        return OutgoingMessage(queue_key, queue_key + ".msgs", redis_message_id, dramatiq.get_encoder().encode(fields))


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" at {os.path.basename(last.filename)}:{last.lineno} in {last.name}"


class ImportRunner:
    """Runs :func:`importer.domain.run_import.run_import` for the actor and
    remembers which attempt each dramatiq message started (with its fencing
    token), for AttemptRecorder and for the lease renewal of the Reconciler."""

    def __init__(self, store: AttemptStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        # dramatiq message id -> (jobId, attempt, token)
        self._attempts: dict[str, tuple[str, int, str]] = {}

    def attempt_of(self, message_id: str) -> tuple[str, int, str] | None:
        return self._attempts.get(message_id)

    def forget(self, message_id: str) -> None:
        self._attempts.pop(message_id, None)

    def in_flight(self) -> list[tuple[str, str]]:
        """(jobId, token) of every attempt running in this process."""
        return [(job_id, token) for job_id, _, token in list(self._attempts.values())]

    def run(self, body: Any, message_id: str = "", handed_over: tuple[bytes, QueueAck] | None = None) -> str:
        """``handed_over``: the upload that came with the message and the ack
        the one-script attempt makes (:class:`MessageHandover`)."""
        def started(job_id: str, attempt: int, token: str) -> None:
            self._attempts[message_id] = (job_id, attempt, token)

        store, upload = self.store, None
        if handed_over is not None and isinstance(self.store, RedisStore):
            upload, ack = handed_over
            store = _Acknowledging(self.store, ack)
        return run_import(
            store, body, accepted_versions=self.settings.accepted_versions, max_rows=self.settings.max_rows,
            log=self._log, on_started=started, upload=upload,
        )

    @staticmethod
    def _log(event: str, level: int = logging.INFO, **fields: Any) -> None:
        log_event(log, event, level, **fields)


class _Acknowledging:
    """The store of one message's attempt, whose one-script step also acknowledges the message."""

    def __init__(self, store: RedisStore, ack: QueueAck) -> None:
        self._store = store
        self._ack = ack

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def start_and_apply(self, **kwargs: Any) -> Any:
        return self._store.start_and_apply(**kwargs, ack=self._ack)


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
        job_id, attempt, token = known
        # The record's attempt counter is the truth (redeliveries and the
        # reconciler's resends count too); when dramatiq has no retry left for
        # this message, the reconciler sends it after nextAttemptAt + grace.
        final = attempt >= self.settings.max_attempts
        code = _code_for(exception)
        backoff = min(self.settings.min_backoff_ms * (2 ** max(0, attempt - 1)), self.settings.max_backoff_ms)
        diagnostic = f"{type(exception).__name__}: {exception}{_where(exception)}"
        log_event(
            log, "import.attempt_failed", logging.WARNING, jobId=job_id, attempt=attempt, code=code,
            final=final, exc_info=(type(exception), exception, exception.__traceback__),
        )
        try:
            outcome = self.runner.store.record_failure(
                job_id=job_id, attempt=attempt, final=final, error=PublicError.from_code(code),
                diagnostic=diagnostic, next_attempt_at_ms=None if final else int(time.time() * 1000) + backoff,
                token=token,
            )
            if outcome == "stale":  # a newer attempt holds the job: this failure is history
                log_event(log, "import.failure_fenced", logging.WARNING, jobId=job_id, attempt=attempt)
        except StoreUnavailable:
            # The job keeps its deadline: the reconciler sends it again once the lease runs out.
            log_event(log, "import.record_failure_lost", logging.ERROR, jobId=job_id, attempt=attempt)

    def after_skip_message(self, broker: Any, message: Any) -> None:
        self.runner.forget(message.message_id)


class Reconciler(Middleware):
    """Every accepted import ends: the job record is the truth, this enforces it.

    One thread per worker process. Every tick it

    1. renews the lease of the attempts running in this process (renew.lua):
       a dead or SIGSTOPped worker stops renewing, so its job's deadline passes
       after IMPORTER_ATTEMPT_LEASE seconds;
    2. under a cluster-wide Redis lock (one pass per interval across all
       workers), runs reconcile.lua: every non-final job past its deadline is
       sent again (an active one is taken back from its attempt first, which
       fences that attempt off), or failed with import.attempts_exhausted once
       its attempts are used up; sends those messages; on dramatiq's Redis
       broker it also requeues dead workers' messages now (dramatiq only does
       it on a random fraction of its calls) and drops stranded messages of
       finished jobs from live workers' acks sets (an ack that failed on a
       sick Redis leaves them there for good).

    Sending twice is harmless: start.lua drops a duplicate of a finished job
    or of a job whose attempt holds a live lease, and the done marker stops a
    second addition. It replaces the unsent sweeper (README, "Every accepted
    import ends").
    """

    def __init__(self, store: RedisStore, runner: ImportRunner, settings: Settings) -> None:
        self.store = store
        self.runner = runner
        self.settings = settings
        self.broker: Any = None
        self.queue: ImportQueue | None = None
        self._stop = threading.Event()
        self._draining = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def tick_s(self) -> float:
        return min(self.settings.reconcile_interval_s, self.settings.attempt_lease_s / 3)

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        self.broker = broker
        self.queue = ImportQueue(broker, self.settings)
        self._thread = threading.Thread(target=self._loop, name="importer-reconciler", daemon=True)
        self._thread.start()

    def before_worker_shutdown(self, broker: Any, worker: Any) -> None:
        # No more passes; the leases of the imports still finishing are renewed
        # until dramatiq has stopped its worker threads.
        self._draining.set()

    def after_worker_shutdown(self, broker: Any, worker: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.redis_socket_timeout_s + 2)

    def _loop(self) -> None:
        last_pass = 0.0
        while not self._stop.wait(self.tick_s):
            try:
                self.store.renew(self.runner.in_flight())
                if self._draining.is_set():
                    continue
                if time.monotonic() - last_pass >= self.settings.reconcile_interval_s:
                    last_pass = time.monotonic()
                    self.reconcile_once()
            except StoreUnavailable:
                log_event(log, "reconciler.store_unavailable", logging.WARNING)
            except Exception:  # never let the reconciler thread die
                log.exception("reconciler.error")

    def reconcile_once(self) -> int:
        """One pass if no other process holds the lock; returns how many messages it sent."""
        lock = self.store.keys.reconciler_lock
        with store_errors():
            if not self.store.client.set(lock, os.getpid(), nx=True, px=int(self.settings.reconcile_interval_s * 1000)):
                return 0
        self._requeue_dead_workers()
        sent = 0
        for job_id, batch_id, upload_id in self.store.reconcile():
            assert self.queue is not None  # set at worker boot, before the loop starts
            self.queue.send(job_id=job_id, batch_id=batch_id, upload_id=upload_id)
            log_event(log, "reconciler.resent", jobId=job_id, batchId=batch_id)
            sent += 1
        self._drop_stranded_acks()
        return sent

    def _queues(self) -> tuple[str, str]:
        from dramatiq.common import dq_name

        return self.settings.queue_name, dq_name(self.settings.queue_name)

    def _requeue_dead_workers(self) -> None:
        """dramatiq's own maintenance (dead workers' unacked messages back to
        the queue), run every pass instead of on a random fraction of calls."""
        broker = self.broker
        if not isinstance(broker, RedisBroker):
            return
        from dramatiq.common import current_millis

        with store_errors():
            for queue in self._queues():
                broker.scripts["dispatch"](
                    args=["qsize", current_millis(), queue, broker.broker_id, broker.heartbeat_timeout,
                          broker.dead_message_ttl, 1, broker._max_unpack_size()],
                    keys=[broker.namespace],
                )

    def _drop_stranded_acks(self) -> int:
        """Messages of finished (or removed) jobs left in any worker's acks set."""
        broker = self.broker
        if not isinstance(broker, RedisBroker):
            return 0
        client, ns, dropped = broker.client, broker.namespace, 0
        with store_errors():
            workers = [w.decode() if isinstance(w, bytes) else w for w in client.zrange(f"{ns}:__heartbeats__", 0, -1)]
            for queue in self._queues():
                msgs_key = f"{ns}:{queue}.msgs"
                for worker_id in workers:
                    acks_key = f"{ns}:__acks__.{worker_id}.{queue}"
                    ids = list(client.smembers(acks_key))
                    if not ids:
                        continue
                    bodies = client.hmget(msgs_key, ids)
                    job_ids = [_job_id_in(body) for body in bodies]
                    pipe = client.pipeline(transaction=False)
                    for job_id in job_ids:
                        pipe.hget(self.store.keys.job(job_id), "state") if job_id else pipe.echo("")
                    states = pipe.execute()
                    drop = [mid for mid, body, state in zip(ids, bodies, states)
                            if body is None or state in (None, b"", b"completed", b"failed")]
                    if drop:
                        pipe = client.pipeline(transaction=True)
                        pipe.srem(acks_key, *drop)
                        pipe.hdel(msgs_key, *drop)
                        pipe.execute()
                        dropped += len(drop)
        if dropped:
            log_event(log, "reconciler.stranded_acks_dropped", count=dropped)
        return dropped


def _job_id_in(raw: bytes | None) -> str:
    """The jobId a stored dramatiq message carries ('' when unreadable)."""
    if raw is None:
        return ""
    try:
        body = json.loads(raw)["args"][0]
        return str(body.get("jobId") or "") if isinstance(body, dict) else ""
    except (ValueError, KeyError, IndexError, TypeError):
        return ""


def declare_import_actor(broker: dramatiq.Broker, runner: ImportRunner, settings: Settings) -> dramatiq.Actor:
    """The import actor: as thin as a handler, it calls the runner."""
    handover: MessageHandover | None = getattr(broker, "handover", None)

    def import_shipment(body: dict[str, Any]) -> None:
        message = CurrentMessage.get_current_message()
        if message is None:
            runner.run(body)
            return
        runner.run(body, message.message_id, handover.take(message) if handover is not None else None)

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
