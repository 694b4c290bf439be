"""The worker's middleware: the attempt's outcome recorded, the reconciler's loop, connections closed last."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from dramatiq.middleware import Middleware

from importer.adapters.dramatiq import private
from importer.adapters.logs import log_event
from importer.adapters.redis.errors import StoreUnavailable, store_errors
from importer.adapters.redis.records import members_of
from importer.adapters.redis.store import RedisStore
from importer.adapters.settings import Settings
from importer.domain.contract import every_live_worker_reads_groups, job_ids_of
from importer.domain.errors import PublicError
from importer.domain.run_import import PermanentImportFailure
from importer.domain.submit_import import send_recorded

from importer.adapters.dramatiq.broker import ImporterRedisBroker
from importer.adapters.dramatiq.producer import ImportQueue
from importer.adapters.dramatiq.runner import ImportRunner, PendingFailure, code_for, where

log = logging.getLogger("importer.worker")


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
        # The record decides whether this was the last attempt that counts
        # (fail.lua 'auto': attempt - outages - stalls); an attempt that lost
        # its store is an outage: never counted, never final. When dramatiq has
        # no retry left for this message, the reconciler sends it after
        # nextAttemptAt + grace.
        code = code_for(exception)
        outage = code == "import.store_unavailable"
        backoff = min(self.settings.min_backoff_ms * (2 ** max(0, attempt - 1)), self.settings.max_backoff_ms)
        failure = PendingFailure(
            job_id=job_id, attempt=attempt, token=token, code=code, outage=outage,
            diagnostic=f"{type(exception).__name__}: {exception}{where(exception)}",
            next_attempt_at_ms=int(time.time() * 1000) + backoff,
        )
        exc_info = (type(exception), exception, exception.__traceback__)
        try:
            outcome = _store_failure(self.runner.store, failure)
        except StoreUnavailable:
            # Recorded once the store answers again (the Reconciler's loop);
            # meanwhile its lease is renewed, so it is no stall either.
            _log_failed(failure, exc_info)
            self.runner.keep_pending(failure)
            log_event(log, "import.record_failure_pending", logging.WARNING, jobId=job_id, attempt=attempt)
            return
        if outcome == "finished":
            # The job had ended when the attempt raised: an interruption (the time
            # limit) can only be raised in Python, so one that fired while the
            # worker waited for its apply script's reply arrives once that script
            # committed. Nothing failed, nothing is recorded; dramatiq's next
            # delivery of the message finds the job finished.
            log_event(log, "import.interrupted_after_end", logging.INFO, jobId=job_id, attempt=attempt, code=code,
                      exc_info=exc_info)
            return
        _log_failed(failure, exc_info)
        _log_recorded(failure, outcome)

    def after_skip_message(self, broker: Any, message: Any) -> None:
        self.runner.forget(message.message_id)


def record_failure(store: Any, failure: PendingFailure) -> None:
    """Record a failure that waited for the store (the Reconciler's loop), and log the outcome."""
    _log_recorded(failure, _store_failure(store, failure))


def _store_failure(store: Any, failure: PendingFailure) -> str:
    return str(store.record_failure(
        job_id=failure.job_id, attempt=failure.attempt, final=False if failure.outage else None,
        error=PublicError.from_code(failure.code), diagnostic=failure.diagnostic,
        next_attempt_at_ms=failure.next_attempt_at_ms, token=failure.token, outage=failure.outage,
    ))


def _log_failed(failure: PendingFailure, exc_info: Any) -> None:
    log_event(
        log, "import.attempt_failed", logging.WARNING, jobId=failure.job_id, attempt=failure.attempt, code=failure.code,
        outage=failure.outage, exc_info=exc_info,
    )


def _log_recorded(failure: PendingFailure, outcome: str) -> None:
    if outcome == "stale":  # a newer attempt holds the job: this failure is history
        log_event(log, "import.failure_fenced", logging.WARNING, jobId=failure.job_id, attempt=failure.attempt)
    else:
        log_event(log, "import.failure_recorded", logging.INFO, jobId=failure.job_id, attempt=failure.attempt,
                  state=outcome, outage=failure.outage)


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
    second addition. It replaces the unsent sweeper (docs/reliability.md, "Every accepted
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
                for failure in self.runner.pending():
                    record_failure(self.store, failure)
                    self.runner.drop_pending(failure)
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
        due = self.store.reconcile()
        sent = 0
        if due:
            assert self.queue is not None  # set at worker boot, before the loop starts
            # As a bulk's: group messages per location while every live worker reads them.
            grouped = every_live_worker_reads_groups(self.store.live_workers().values())
            batch_of = {job_id: batch_id for job_id, batch_id, _ in due}
            for job_id, failed in send_recorded(self.store, self.queue, due, grouped=grouped, mark_sent=False):
                if failed is not None:  # still due: the next pass sends it
                    log_event(log, "reconciler.send_failed", logging.WARNING, jobId=job_id, error=type(failed).__name__)
                    continue
                log_event(log, "reconciler.resent", jobId=job_id, batchId=batch_of[job_id], grouped=grouped)
                sent += 1
        self._drop_stranded_acks()
        return sent

    def _queues(self) -> list[str]:
        """Every location's queue and its delay queue (one of each on one node)."""
        from dramatiq.common import dq_name

        queues = {self.broker.location_queues.queue_of(location) for location in self.store.locations()}
        return [name for queue in sorted(queues) for name in (queue, dq_name(queue))]

    def _requeue_dead_workers(self) -> None:
        """dramatiq's own maintenance (dead workers' unacked messages back to
        the queue), run every pass instead of on a random fraction of calls."""
        broker = self.broker
        if not isinstance(broker, ImporterRedisBroker):
            return
        with store_errors():
            for queue in self._queues():
                broker.scripts["dispatch"](
                    args=broker.dispatch_args("qsize", queue, maintenance=1),
                    keys=broker.location_queues.dispatch_keys(queue),
                )

    def _drop_stranded_acks(self) -> int:
        """Messages of finished (or removed) jobs left in any worker's acks set."""
        broker = self.broker
        if not isinstance(broker, ImporterRedisBroker):
            return 0
        client, dropped = broker.client, 0
        with store_errors():
            for queue in self._queues():
                ns = broker.location_queues.namespace_of(queue)
                workers = members_of(client.zrange(private.heartbeats_key(ns), 0, -1))
                msgs_key = private.messages_key(ns, queue)
                for worker_id in workers:
                    acks_key = private.acks_key(ns, worker_id, queue)
                    ids = list(client.smembers(acks_key))
                    if not ids:
                        continue
                    bodies = client.hmget(msgs_key, ids)
                    # A group message's jobs: stranded once every one of them is finished.
                    jobs_of = [_job_ids_in(body) for body in bodies]
                    pipe = client.pipeline(transaction=False)
                    for job_ids in jobs_of:
                        for job_id in job_ids or [""]:
                            pipe.hget(self.store.partition_of(job_id).job(job_id), "state") if job_id else pipe.echo("")
                    states = iter(pipe.execute())
                    finished = [all([next(states) in (None, b"", b"completed", b"failed") for _ in job_ids or [""]])
                                for job_ids in jobs_of]
                    drop = [mid for mid, body, done in zip(ids, bodies, finished) if body is None or done]
                    if drop:
                        pipe = client.pipeline(transaction=True)
                        pipe.srem(acks_key, *drop)
                        pipe.hdel(msgs_key, *drop)
                        pipe.execute()
                        dropped += len(drop)
        if dropped:
            log_event(log, "reconciler.stranded_acks_dropped", count=dropped)
        return dropped

def _job_ids_in(raw: bytes | str | None) -> list[str]:
    """The jobIds a stored dramatiq message carries (a group's every one; [] when unreadable)."""
    if raw is None:
        return []
    try:
        return job_ids_of(json.loads(raw)["args"][0])
    except (ValueError, KeyError, IndexError, TypeError):
        return []

class LocationConsumers(Middleware):
    """On a Redis Cluster, each location's messages are in a queue of its own
    partition (LocationQueues): this worker consumes every location's queue.

    At boot and then every ``interval_s`` it reads the locations registry
    (one SMEMBERS in the control partition) and declares the queue of each
    location it does not consume yet; dramatiq's worker then starts a consumer
    for it and for its delay queue. A location's first import waits at most
    that long. Nothing to do on one node or on RabbitMQ (one queue).
    """

    def __init__(self, store: RedisStore, interval_s: float = 1.0) -> None:
        self.store = store
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        queues = getattr(broker, "location_queues", None)
        if queues is None or not queues.per_location:
            return
        self._thread = threading.Thread(target=self._loop, args=(broker, queues), name="importer-locations", daemon=True)
        self._thread.start()

    def before_worker_shutdown(self, broker: Any, worker: Any) -> None:
        self._stop.set()

    def _loop(self, broker: Any, queues: Any) -> None:
        while not self._stop.is_set():
            try:
                for location in self.store.locations():
                    queue = queues.queue_of(location)
                    if queue not in broker.queues and not self._stop.is_set():
                        broker.declare_queue(queue)
                        log_event(log, "worker.location_queue", location=location, queue=queue)
            except StoreUnavailable:
                pass  # the next look, once the control partition answers
            except Exception:  # never let this thread die
                log.exception("worker.location_queues_error")
            self._stop.wait(self.interval_s)


class CloseConnections(Middleware):
    """Closes the worker process's Redis connections after dramatiq has stopped
    its worker threads (in-flight imports finished or the shutdown deadline
    passed) and its consumers: never before."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def after_worker_shutdown(self, broker: Any, worker: Any) -> None:
        self.client.close()
        log_event(log, "worker.redis_closed")


class StartAtBoot(Middleware):
    """Calls ``start`` in the worker process (after dramatiq's fork) before it consumes:
    a process's own threads, such as its view of the locations behind the ledger."""

    def __init__(self, start: Callable[[], None]) -> None:
        self.start = start

    def before_worker_boot(self, broker: Any, worker: Any) -> None:
        self.start()
