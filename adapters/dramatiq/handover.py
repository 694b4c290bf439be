"""The handover between dramatiq's Redis consumer and the import actor: the
small uploads that came with fetched messages, the riders a delivery takes
into its one-step call, and the messages the import's own script
acknowledged (:class:`MessageHandover`; the consumer is broker.py's
``_SafeRequeueConsumer``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import dramatiq

from importer.adapters.dramatiq import private
from importer.adapters.redis.keys import LocationQueues
from importer.adapters.redis.records import QueueAck, text_of
from importer.domain.locations import location_of_job

log = logging.getLogger("importer.worker")


class Handed(NamedTuple):
    """What came with one fetched message for its actor: its upload and the ack
    the one-step script makes, and, when another delivery's call already ran
    its attempt with its own (MessageHandover.claim_together), that outcome."""

    upload: bytes
    ack: QueueAck
    queue: str
    job_id: str
    settled: Any = None


class Rider(NamedTuple):
    """A fetched message whose import a delivery takes into its own one-step call."""

    redis_message_id: str
    body: Any
    upload: bytes
    ack: QueueAck
    #: its dramatiq message_id and options (traceparent, retries...), for its span
    message_id: str = ""
    options: Any = None


class _RiderState:
    """A fetched message taken into another delivery's call before any consumer
    yielded it to dramatiq (a rider): the leader finishes it, or gives it back."""

    __slots__ = ("kept", "consumer", "proxy", "finished", "labels", "taken_at")

    def __init__(self, kept: tuple[bytes, str, bytes, str]) -> None:
        self.kept = kept
        self.consumer: Any = None  # the consumer that met it in its cache meanwhile, and skipped it
        self.proxy: Any = None
        self.finished = False
        self.labels = (kept[1], "")  # its message's queue_name and actor_name, once decoded
        self.taken_at = time.monotonic()


class MessageHandover:
    """What dramatiq's consumer hands the import actor beside a message, and back.

    * Small uploads: the fetch (fetch.lua) brings the upload of each fetched
      import message of at most ``max_bytes`` with it, kept here by the
      message's ``redis_message_id`` until the actor takes it. The actor then
      parses and validates it first and runs the attempt as one script
      (start_apply.lua), which also acknowledges the message.
    * Riders (group commit): an actor that takes its upload may also take up
      to ``together - 1`` other fetched messages of the same queue and
      location that no consumer has yielded to dramatiq yet
      (``claim_together``, the last fetched first), and run all their
      attempts in its one call. A rider whose message that call acknowledged
      is finished by the leader (``finish``): it never goes through
      dramatiq's consumer, worker thread and middleware. Any other rider (its
      import needs its own delivery, or the call failed) is given back
      (``give_back``): the consumer yields it, and its actor reports the
      outcome the call gave it (``Handed.settled``) or runs on its own.
    * So that riders exist, a consumer of an import queue yields a small
      import's message only while fewer than ``ahead`` such messages wait in
      dramatiq's work queue (``room_to_yield``): the rest wait in the
      consumer's cache, where a leader can take them.
    * Acknowledged by the script: those messages' ids, so that the consumer
      skips dramatiq's own ack (one round trip and one script call fewer per import).

    Shared by the consumer threads and the worker threads of one process.
    ``finished_listeners`` are told of each rider finished (its queue_name,
    actor_name and milliseconds in its leader's call), as dramatiq's middleware
    is of each message processed (adapters/processes/worker_metrics.py).
    """

    #: A bound on uploads kept for messages no actor took (a consumer closed
    #: with messages in its cache, a message of a removed job...).
    MAX_KEPT = 10_000

    def __init__(
        self, max_bytes: int, other_locations: tuple[str, ...] = (), *, together: int = 1, ahead: int = 8,
    ) -> None:
        self.max_bytes = max_bytes
        #: The two halves of another location's upload prefix around its name, () = the queue's location's jobs only (fetch.lua).
        self.other_locations = other_locations
        self.together = together
        self.ahead = ahead
        self.location_queues: LocationQueues | None = None
        self.worker_id = ""
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        # redis_message_id -> (upload, the queue it was fetched from, the raw message, its jobId)
        self._uploads: dict[str, tuple[bytes, str, bytes, str]] = {}
        # Small imports' messages yielded to dramatiq whose actor has not taken them yet.
        self._yielded: set[str] = set()
        self._riders: dict[str, _RiderState] = {}
        # Riders given back: what their actor takes (its upload, and the outcome the call gave it, or None).
        self._given: dict[str, tuple[tuple[bytes, str, bytes, str], Any]] = {}
        # Given back after their consumer had met them in its cache: yielded from here, by queue.
        self._returned: dict[str, list[Any]] = {}
        self._acked: set[str] = set()
        self.finished_listeners: list[Callable[[str, str, float], None]] = []

    def keep(self, queue_name: str, messages: list[Any], fetched: list[list[Any]]) -> None:
        """``fetched``: fetch.lua's redis_message_ids, uploads, jobIds and positions in ``messages``."""
        ids, uploads, jobs, positions = fetched
        with self._lock:
            if len(self._uploads) > self.MAX_KEPT:
                self._uploads.clear()  # the actor then takes the separate steps: nothing is lost
            for rid, upload, job_id, position in zip(ids, uploads, jobs, positions):
                self._uploads[text_of(rid)] = (upload, queue_name, messages[int(position) - 1], text_of(job_id))

    def drop(self, redis_message_ids: list[str]) -> None:
        """Messages given back to the queue (requeued): forget them."""
        with self._lock:
            for rid in redis_message_ids:
                self._uploads.pop(rid, None)
                self._given.pop(rid, None)
                self._acked.discard(rid)
                self._yielded.discard(rid)
            self._room.notify_all()

    def _ack(self, rid: str, queue: str) -> QueueAck:
        assert self.location_queues is not None
        ns = self.location_queues.namespace_of(queue)
        return QueueAck(
            acks_key=private.acks_key(ns, self.worker_id, queue),
            messages_key=private.messages_key(ns, queue), heartbeats_key=private.heartbeats_key(ns),
            redis_message_id=rid, worker_id=self.worker_id, acknowledged=lambda: self._acked.add(rid),
        )

    # -- the consumer's side ------------------------------------------------

    def room_to_yield(self, queue_name: str, wait_s: float = 0.005) -> bool:
        """Whether a consumer of ``queue_name`` may yield its next message now;
        when not, waits up to ``wait_s`` for an actor to take one."""
        if self.together <= 1 or self.location_queues is None or not self.location_queues.is_import_queue(queue_name):
            return True
        with self._room:
            if len(self._yielded) < self.ahead:
                return True
            self._room.wait(wait_s)
            return len(self._yielded) < self.ahead

    def returned(self, queue_name: str) -> Any:
        """A message given back after its consumer had skipped it, to yield now, or None."""
        with self._lock:
            waiting = self._returned.get(queue_name)
            if not waiting:
                return None
            proxy = waiting.pop(0)
            self._yielded.add(proxy.options.get("redis_message_id"))
            return proxy

    def to_yield(self, message: Any, consumer: Any) -> bool:
        """Whether the consumer yields ``message`` (just taken from its cache) to
        dramatiq: not a rider's. A finished rider's is forgotten at once; one
        still in its leader's call is remembered, for the leader to give back."""
        rid = message.options.get("redis_message_id")
        with self._lock:
            rider = self._riders.get(rid)
            if rider is None:
                if rid in self._uploads or rid in self._given:
                    self._yielded.add(rid)
                return True
            if rider.finished:
                del self._riders[rid]
                consumer.queued_message_ids.discard(message.message_id)
            else:
                rider.consumer, rider.proxy = consumer, message
            return False

    def cached(self, queue_name: str, cache: list[Any]) -> list[Any]:
        """What a closing consumer requeues: the raw messages of its cache that
        are not riders', and the messages given back to it. A rider still in
        its leader's call is kept as met, so that if it is given back the
        queue's next consumer yields it; a finished one is forgotten."""
        with self._lock:
            riders = {state.kept[2]: rid for rid, state in self._riders.items()}
            waiting = []
            for raw in cache:
                rid = riders.get(raw)
                if rid is None:
                    waiting.append(raw)
                elif self._riders[rid].finished:
                    del self._riders[rid]
                else:
                    self._riders[rid].proxy = dramatiq.MessageProxy(dramatiq.Message.decode(raw))
            return [*waiting, *self._returned.pop(queue_name, [])]

    # -- the actors' side ---------------------------------------------------

    def take(self, message: Any) -> Handed | None:
        """The upload that came with this message and the ack the script makes, or None."""
        rid = message.options.get("redis_message_id") if message is not None else None
        if not rid or self.location_queues is None:
            return None
        with self._lock:
            self._yielded.discard(rid)
            self._room.notify()
            kept = self._uploads.pop(rid, None)
            given = self._given.pop(rid, None) if kept is None else None
        if given is not None:
            (upload, queue, _raw, job_id), settled = given
            return Handed(upload, self._ack(rid, queue), queue, job_id, settled)
        if kept is None:
            return None
        upload, queue, _raw, job_id = kept
        return Handed(upload, self._ack(rid, queue), queue, job_id)

    def claim_together(self, handed: Handed) -> list[Rider]:
        """Up to ``together - 1`` fetched messages of the same queue and location
        as ``handed``'s that no consumer has yielded yet, as riders of one call
        with it; each must then be finished or given back."""
        if self.together <= 1:
            return []
        location = location_of_job(handed.job_id)
        taken: list[tuple[str, tuple[bytes, str, bytes, str]]] = []
        with self._lock:
            for rid in reversed(self._uploads):
                kept = self._uploads[rid]
                if (rid not in self._yielded and kept[1] == handed.queue and kept[3] != handed.job_id
                        and location_of_job(kept[3]) == location):
                    taken.append((rid, kept))
                    if len(taken) == self.together - 1:
                        break
            for rid, kept in taken:
                del self._uploads[rid]
                self._riders[rid] = _RiderState(kept)
        found = []
        for rid, (upload, queue, raw, _job_id) in taken:
            try:
                message = dramatiq.Message.decode(raw)
                body = message.args[0]
            except Exception:  # not a message this actor can read: its own actor deals with it
                self.give_back(rid, None)
                continue
            self._riders[rid].labels = (message.queue_name, message.actor_name)
            found.append(Rider(rid, body, upload, self._ack(rid, queue), message.message_id, message.options))
        return found

    def acknowledged(self, redis_message_id: str) -> bool:
        """Whether the leader's call acknowledged this rider's message."""
        with self._lock:
            return redis_message_id in self._acked

    def finish(self, redis_message_id: str) -> None:
        """A rider whose message the leader's call acknowledged, reported by the
        leader: done, without dramatiq."""
        with self._lock:
            self._acked.discard(redis_message_id)
            rider = self._riders.get(redis_message_id)
            if rider is None:
                return
            if rider.proxy is not None:
                if rider.consumer is not None:
                    rider.consumer.queued_message_ids.discard(rider.proxy.message_id)
                del self._riders[redis_message_id]
            else:
                rider.finished = True  # its consumer forgets it when it meets it
        for listener in self.finished_listeners:
            try:
                listener(*rider.labels, (time.monotonic() - rider.taken_at) * 1000)
            except Exception:  # a metric must never fail an import that is done
                log.exception("rider listener failed", extra={"event": "worker.rider_listener_failed"})

    def give_back(self, redis_message_id: str, settled: Any) -> None:
        """A rider that needs its own delivery: its actor gets the outcome the
        leader's call gave it (``settled``), or runs on its own (None)."""
        with self._lock:
            rider = self._riders.pop(redis_message_id, None)
            if rider is None:
                return
            self._given[redis_message_id] = (rider.kept, settled)
            if rider.proxy is not None:
                self._returned.setdefault(rider.kept[1], []).append(rider.proxy)

    def acked_by_script(self, message: Any) -> bool:
        rid = message.options.get("redis_message_id")
        with self._lock:
            self._yielded.discard(rid)
            self._room.notify()
            if rid in self._acked:
                self._acked.discard(rid)
                return True
        return False
