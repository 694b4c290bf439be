"""The producer: the versioned message of a recorded job, sent or written with its record."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from importer.adapters import tracing
from importer.adapters.dramatiq import private
from importer.adapters.redis.errors import StoreUnavailable, unavailable
from importer.adapters.redis.records import OutgoingGroup, OutgoingMessage, group_entry
from importer.adapters.settings import Settings
from importer.domain.contract import encode_group, encode_message

from importer.adapters.dramatiq.broker import ACTOR_NAME, ImporterRedisBroker
from importer.domain.locations import location_of_job
from importer.domain.shipment import job_id_for
from importer.domain.ids import random_uuid

log = logging.getLogger("importer.worker")


class ImportQueue:
    """Producer side: sends the versioned message for a recorded job."""

    def __init__(
        self, broker: dramatiq.Broker, settings: Settings, *,
        request_id: Callable[[], str | None] = lambda: None, new_id: Callable[[], str] = random_uuid,
    ) -> None:
        """``request_id``: the id of the request being handled (a version 2
        message carries it); ``new_id``: the generator of message ids."""
        self.broker = broker
        self.settings = settings
        self._request_id = request_id
        self._new_id = new_id

    def send(self, *, job_id: str, batch_id: str, upload_id: str) -> None:
        self.send_raw(self._body(job_id, batch_id, upload_id), self._queue_of(job_id), tracing.traceparent())

    def send_group(self, jobs: Sequence[tuple[str, str, str]]) -> None:
        """One group message (contract version 3) for jobs of one location, each (jobId, batchId, uploadId)."""
        body = encode_group(jobs, request_id=self._request_id())
        self.send_raw(body, self._queue_of(jobs[0][0]), tracing.traceparent())

    def _queue_of(self, job_id: str) -> str:
        """The queue of the job's location (dramatiq's Redis broker on a cluster:
        the location's own, LocationQueues); one queue on RabbitMQ and on one node."""
        if isinstance(self.broker, ImporterRedisBroker):
            return self.broker.location_queues.queue_of(location_of_job(job_id))
        return self.settings.queue_name

    def _body(self, job_id: str, batch_id: str, upload_id: str) -> dict[str, Any]:
        # A version 2 message carries the request id of the POST that made the job (none outside a request).
        return encode_message(
            job_id, batch_id, upload_id, version=self.settings.producer_version, request_id=self._request_id()
        )

    def _message(self, body: dict[str, Any], queue_name: str, traceparent: str = "") -> dramatiq.Message[Any]:
        # [trace] the trace goes on in the worker (an option: workers that do not trace ignore it)
        options = self._options(traceparent)
        return dramatiq.Message(queue_name=queue_name, actor_name=ACTOR_NAME, args=(body,), kwargs={}, options=options)

    def _options(self, traceparent: str) -> dict[str, str]:
        """The message's options beyond dramatiq's: the request that sent it and (traced) its span's context.
        Options, not the body: a worker of any contract version reads the body alike."""
        options = {"traceparent": traceparent} if traceparent else {}
        request_id = self._request_id()
        if request_id is not None:
            options["requestId"] = request_id
        return options

    def send_raw(self, body: dict[str, Any], queue_name: str | None = None, traceparent: str = "") -> None:
        """Send any body, valid or not (tests use it to send a v2 message).

        Any failure of the broker or of its Redis (refused, timed out, out of
        memory, read-only...) is StoreUnavailable: HTTP answers 503 and the
        reconciler sends the message of the recorded job later. On RabbitMQ
        that includes a publish not confirmed within IMPORTER_REDIS_SOCKET_TIMEOUT
        (a blocked connection, a silent broker: adapters/dramatiq/rabbitmq.py).
        """
        try:
            self.broker.enqueue(self._message(body, queue_name or self.settings.queue_name, traceparent))
        except dramatiq.errors.BrokerError as exc:  # RabbitMQ: refused, closed, not confirmed within the bound
            raise StoreUnavailable(f"broker: {type(exc).__name__}: {exc}", "broker_unreachable") from exc
        except redis.RedisError as exc:
            translated = unavailable(exc)
            if translated is None:
                raise
            raise translated from exc

    def writes_to(self, client: Any) -> bool:
        """Whether the broker is dramatiq's Redis broker on this very client, so
        the store can write the message in the script that records the job."""
        return isinstance(self.broker, RedisBroker) and self.broker.client is client

    def redis_message(self, job_id: str, batch_id: str, upload_id: str, traceparent: str = "") -> OutgoingMessage:
        """The message exactly as ``RedisBroker.enqueue`` writes it (no delay):
        a copy with a fresh ``redis_message_id`` option, encoded by dramatiq's
        encoder, stored under that id in ``<namespace>:<queue>.msgs`` and the id
        pushed on ``<namespace>:<queue>``. dramatiq's enqueue middleware hooks
        are not run: no middleware of the producer's broker has any."""
        queue_key, messages_key, redis_message_id, fields = self._redis_fields(
            job_id, self._body(job_id, batch_id, upload_id), traceparent)
        return OutgoingMessage(queue_key, messages_key, redis_message_id, dramatiq.get_encoder().encode(fields))

    def redis_group_message(self, job_id: str, traceparent: str = "") -> OutgoingGroup:
        """A group message (contract version 3) for jobs of ``job_id``'s
        location, as :meth:`send_group` would send it, whose jobs the script
        that records them fills in (enqueue_many.lua): the encoded message is
        cut around its list of jobs. Written as :meth:`redis_message` is."""
        encoder = dramatiq.get_encoder()
        if not isinstance(encoder, dramatiq.JSONEncoder):
            raise TypeError("a group message is filled in by a script only with dramatiq's JSON encoder")
        # A valid entry (an upload id is 32 hex digits), cut out of the encoded message below.
        stand_in = (job_id_for("group-stand-in", location_of_job(job_id)), "group-stand-in", self._new_id().replace("-", ""))
        body = encode_group([stand_in], request_id=self._request_id())
        queue_key, messages_key, redis_message_id, fields = self._redis_fields(job_id, body, traceparent)
        head, found, tail = encoder.encode(fields).partition(group_entry(*stand_in))
        assert found and group_entry(*stand_in) not in tail
        return OutgoingGroup(queue_key, messages_key, redis_message_id, head, tail)

    def _redis_fields(self, job_id: str, body: dict[str, Any], traceparent: str) -> tuple[str, str, str, dict[str, Any]]:
        """The keys of ``job_id``'s queue, a fresh redis_message_id, and the fields
        of a message carrying ``body``: dramatiq.Message(...).copy(options=...)
        without building the two dataclasses (a tenth of a POST's Python time),
        the same fields in the same order, for dramatiq's own (global) encoder."""
        assert isinstance(self.broker, RedisBroker)
        redis_message_id = self._new_id()
        queue = self._queue_of(job_id)
        fields = {
            "queue_name": queue,
            "actor_name": ACTOR_NAME,
            "args": [body],
            "kwargs": {},
            "options": {"redis_message_id": redis_message_id, **self._options(traceparent)},
            "message_id": self._new_id(),  # dramatiq's generate_unique_id(), without its syscall
            "message_timestamp": int(time.time() * 1000),
        }
        ns = self._namespace_of(queue)
        return private.queue_key(ns, queue), private.messages_key(ns, queue), redis_message_id, fields

    def _namespace_of(self, queue: str) -> str:
        assert isinstance(self.broker, RedisBroker)
        return self.broker.location_queues.namespace_of(queue) if isinstance(self.broker, ImporterRedisBroker) else self.broker.namespace
