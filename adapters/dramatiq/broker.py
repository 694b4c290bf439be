"""The broker: dramatiq with this service's middleware and options, on Redis or RabbitMQ.

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
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis
from dramatiq.middleware import CurrentMessage, Middleware, Retries, ShutdownNotifications, TimeLimit

from importer.adapters.dramatiq import private
from importer.adapters.dramatiq.handover import MessageHandover
from importer.adapters.dramatiq.hooks import OwnHooksOnly
from importer.adapters.logs import log_event
from importer.adapters.redis.keys import Keys, LocationQueues, location_upload_prefix
from importer.adapters.redis.scripts import fetch_source
from importer.adapters.settings import Settings

log = logging.getLogger("importer.worker")


ACTOR_NAME = "import_shipment"

def build_broker(
    settings: Settings, client: Any, *, worker_middleware: list[Middleware] | None = None,
    recorder: Middleware | None = None,
) -> dramatiq.Broker:
    """The broker with its middleware declared explicitly (no global broker).

    The transport is configuration only (IMPORTER_BROKER_URL): Redis by
    default (the store's own Redis), or RabbitMQ with publisher confirms, so a
    POST answers 202 only once RabbitMQ has stored the message, and each
    publish is confirmed or fails within IMPORTER_REDIS_SOCKET_TIMEOUT
    (rabbitmq.py). Nothing else in the code base depends on which one it is.
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
        from importer.adapters.dramatiq.rabbitmq import BoundedRabbitmqBroker

        # Every publish (connect, blocked connection, confirm) ends within the bound of a Redis call.
        return BoundedRabbitmqBroker(url=url, bound_s=settings.redis_socket_timeout_s, middleware=middleware)
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
        # On a cluster each location's messages are in its own partition (its slot).
        location_queues=LocationQueues(settings.key_prefix, settings.queue_name, per_location=settings.redis_cluster and not url),
        handover=MessageHandover(
            one_step,
            # On one node main's queue holds every location's messages: its fetch brings their uploads too.
            other_locations=() if settings.redis_cluster else location_upload_prefix(settings.key_prefix),
            together=settings.apply_together_max,
        ),
    )

class _SafeRequeueConsumer(private.RedisConsumer):
    """dramatiq's Redis consumer, whose requeue never raises, which skips the
    ack of a message that the import's own script acknowledged, and which
    leaves riders to their leaders (:class:`MessageHandover`).

    When a fetch fails for anything but a ConnectionError (a timeout, a full
    Redis), dramatiq's consumer thread closes the consumer, which requeues its
    prefetched messages; when that fails too, the exception escapes the
    thread and the thread is gone for good: this process never consumes that
    queue again (fault suite, Redis full). Here the failed requeue is logged
    and the messages stay in this worker's acks set, where the reconciler
    covers them (deadlines; stranded acks of finished jobs dropped).
    """

    def __next__(self) -> Any:
        handover: MessageHandover = self.broker.handover
        returned = handover.returned(self.queue_name)
        if returned is not None:
            return returned
        if self.message_cache and not handover.room_to_yield(self.queue_name):
            return None  # dramatiq's consumer thread calls again (and sees a stop meanwhile)
        while True:
            message = super().__next__()
            if message is None or handover.to_yield(message, self):
                return message

    def close(self) -> None:
        """Requeue what waits in this consumer's cache (with riders' leaders
        holding some back, more than dramatiq's eager consumer ever leaves there)."""
        waiting = self.broker.handover.cached(self.queue_name, self.message_cache)
        self.message_cache = []
        if waiting:
            self.requeue([m if isinstance(m, dramatiq.MessageProxy) else dramatiq.Message.decode(m) for m in waiting])
        super().close()

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

class _RoomForEveryThread(Middleware):
    """Sets the handover's ``ahead`` to at least the worker's thread count once
    the worker boots (dramatiq builds the broker before it knows it)."""

    def __init__(self, handover: MessageHandover) -> None:
        self.handover = handover

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        self.handover.ahead = max(self.handover.ahead, int(getattr(worker, "worker_threads", 0)))


class ImporterRedisBroker(OwnHooksOnly, RedisBroker):
    """dramatiq's Redis broker with :class:`_SafeRequeueConsumer`, whose fetch
    brings small uploads with their messages (:class:`MessageHandover`), and
    whose every dispatch call finds its namespace from the queue's name
    (:class:`LocationQueues`: on a cluster, each location's queue is in its
    own partition); its middleware hooks are called only where a middleware
    has them (:class:`OwnHooksOnly`)."""

    location_queues: LocationQueues
    handover: MessageHandover

    def __init__(self, *, handover: MessageHandover, location_queues: LocationQueues, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        handover.location_queues = location_queues
        handover.worker_id = self.broker_id
        self.handover = handover
        self.location_queues = location_queues
        self.add_middleware(_RoomForEveryThread(handover))
        self._fetch = self.client.register_script(fetch_source(private.dispatch_script()))

    @property
    def consumer_class(self) -> Any:
        return _SafeRequeueConsumer

    #: With a queue per location, how long an idle delay queue's consumer sleeps
    #: between polls at most (ms): its messages are retries, due a second or
    #: more later, so a faster poll of every location's delay queue buys nothing.
    DELAY_QUEUE_IDLE_MS = 1000

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Any:
        if self.location_queues.per_location and queue_name.endswith(".DQ"):
            timeout = max(timeout, self.DELAY_QUEUE_IDLE_MS)
        return super().consume(queue_name, prefetch, timeout)

    def dispatch_args(self, command: str, queue_name: str, *args: Any, maintenance: int | None = None) -> list[Any]:
        """The ARGV of dramatiq's dispatch script for a call, as RedisBroker._dispatch builds it
        (``maintenance`` None: dramatiq's dice for this call)."""
        if maintenance is None:
            maintenance = private.should_do_maintenance(self, command)
        return [
            command, current_millis(), queue_name, self.broker_id, self.heartbeat_timeout,
            self.dead_message_ttl, maintenance, private.max_unpack_size(self), *args,
        ]

    def _dispatch(self, command: str) -> Any:
        """dramatiq's dispatch call (RedisBroker._dispatch), with the namespace of the queue's location."""
        dispatch, queues = self.scripts["dispatch"], self.location_queues

        def do_dispatch(queue_name: str, *args: Any) -> Any:
            return dispatch(args=self.dispatch_args(command, queue_name, *args), keys=queues.dispatch_keys(queue_name))

        return do_dispatch

    def do_fetch(self, queue_name: str, prefetch: int) -> list[Any]:
        """dramatiq's fetch (its dispatch script, run by fetch.lua), plus the small uploads."""
        h, queues = self.handover, self.location_queues
        if h.max_bytes <= 0 or not queues.is_import_queue(queue_name):
            return private.dispatch(self, "fetch")(queue_name, prefetch)  # type: ignore[no-any-return]
        messages, *fetched = self._fetch(
            keys=queues.dispatch_keys(queue_name),
            args=self.dispatch_args(
                "fetch", queue_name, prefetch,
                queues.upload_prefix_of(queue_name), h.max_bytes, ACTOR_NAME, *(h.other_locations or ("", "")),
            ),
        )
        if fetched[0]:
            h.keep(queue_name, messages, fetched)
        return messages  # type: ignore[no-any-return]
