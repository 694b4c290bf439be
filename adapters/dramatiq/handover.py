"""The handover between dramatiq's Redis consumer and the import actor: the
small uploads that came with fetched messages, the companions a delivery takes
into its one-step call, and the messages the import's own script
acknowledged (:class:`MessageHandover`; the consumer is broker.py's
``_SafeRequeueConsumer``)."""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import dramatiq

from importer.adapters.dramatiq import private
from importer.adapters.redis.keys import LocationQueues
from importer.adapters.redis.records import QueueAck, text_of
from importer.domain.locations import location_of_job


class Handed(NamedTuple):
    """What came with one fetched message for its actor: its upload and the ack
    the one-step script makes, and, when another delivery's call already ran
    its attempt with its own (MessageHandover.claim_together), that outcome."""

    upload: bytes
    ack: QueueAck
    queue: str
    job_id: str
    settled: Any = None


class Companion(NamedTuple):
    """A fetched message whose import a delivery takes into its own one-step call."""

    redis_message_id: str
    body: Any
    upload: bytes
    ack: QueueAck


class _Claim:
    """A message taken into another delivery's call: its actor waits for the
    outcome (``settled``), or runs on its own once the claim is released empty."""

    __slots__ = ("kept", "done", "settled")

    def __init__(self, kept: tuple[bytes, str, bytes, str]) -> None:
        self.kept = kept
        self.done = threading.Event()
        self.settled: Any = None


class MessageHandover:
    """What dramatiq's consumer hands the import actor beside a message, and back.

    * Small uploads: the fetch (fetch.lua) brings the upload of each fetched
      import message of at most ``max_bytes`` with it, kept here by the
      message's ``redis_message_id`` until the actor takes it. The actor then
      parses and validates it first and runs the attempt as one script
      (start_apply.lua), which also acknowledges the message.
    * Together (group commit): an actor that takes its upload may also take
      up to ``together - 1`` other fetched messages of the same queue and
      location whose actors have not started (``claim_together``, the last
      fetched first: the furthest from a worker thread), and run all their
      attempts in its one call. Each of those actors then reports the
      outcome its import got (``Handed.settled``); one that starts while the
      call is on its way waits for it, at most ``wait_s``, then runs on its
      own (harmless: the done marker and the fencing token decide).
    * Acknowledged by the script: those messages' ids, so that the consumer
      skips dramatiq's own ack (one round trip and one script call fewer per import).

    Shared by the consumer thread and the worker threads of one process.
    """

    #: A bound on uploads kept for messages no actor took (a consumer closed
    #: with messages in its cache, a message of a removed job...).
    MAX_KEPT = 10_000

    def __init__(
        self, max_bytes: int, other_locations: tuple[str, ...] = (), *, together: int = 1, wait_s: float = 10.0,
    ) -> None:
        self.max_bytes = max_bytes
        #: The two halves of another location's upload prefix around its name, () = the queue's location's jobs only (fetch.lua).
        self.other_locations = other_locations
        self.together = together
        self.wait_s = wait_s
        self.location_queues: LocationQueues | None = None
        self.worker_id = ""
        self._lock = threading.Lock()
        # redis_message_id -> (upload, the queue it was fetched from, the raw message, its jobId)
        self._uploads: dict[str, tuple[bytes, str, bytes, str]] = {}
        self._claims: dict[str, _Claim] = {}
        self._acked: set[str] = set()

    def keep(self, queue_name: str, messages: list[Any], fetched: list[list[Any]]) -> None:
        """``fetched``: fetch.lua's redis_message_ids, uploads, jobIds and positions in ``messages``."""
        ids, uploads, jobs, positions = fetched
        with self._lock:
            if len(self._uploads) > self.MAX_KEPT:
                self._uploads.clear()  # the actor then takes the separate steps: nothing is lost
            for rid, upload, job_id, position in zip(ids, uploads, jobs, positions):
                self._uploads[text_of(rid)] = (upload, queue_name, messages[int(position) - 1], text_of(job_id))

    def drop(self, redis_message_ids: list[str]) -> None:
        with self._lock:
            for rid in redis_message_ids:
                self._uploads.pop(rid, None)
                self._acked.discard(rid)

    def _ack(self, rid: str, queue: str) -> QueueAck:
        assert self.location_queues is not None
        ns = self.location_queues.namespace_of(queue)
        return QueueAck(
            acks_key=private.acks_key(ns, self.worker_id, queue),
            messages_key=private.messages_key(ns, queue), heartbeats_key=private.heartbeats_key(ns),
            redis_message_id=rid, worker_id=self.worker_id, acknowledged=lambda: self._acked.add(rid),
        )

    def take(self, message: Any) -> Handed | None:
        """The upload that came with this message and the ack the script makes, or None."""
        rid = message.options.get("redis_message_id") if message is not None else None
        if not rid or self.location_queues is None:
            return None
        with self._lock:
            kept = self._uploads.pop(rid, None)
            claim = self._claims.get(rid) if kept is None else None
        if claim is not None:
            # In another delivery's call: its outcome, or (released empty, or too late) this actor's own attempt.
            claim.done.wait(self.wait_s)
            with self._lock:
                self._claims.pop(rid, None)
            kept = claim.kept
            upload, queue, _raw, job_id = kept
            return Handed(upload, self._ack(rid, queue), queue, job_id, claim.settled)
        if kept is None:
            return None
        upload, queue, _raw, job_id = kept
        return Handed(upload, self._ack(rid, queue), queue, job_id)

    def claim_together(self, handed: Handed) -> list[Companion]:
        """Up to ``together - 1`` fetched messages of the same queue and location
        as ``handed``'s whose actors have not started, for one call with it; each
        must then be settled or released (:meth:`settle`)."""
        if self.together <= 1:
            return []
        location = location_of_job(handed.job_id)
        taken: list[tuple[str, tuple[bytes, str, bytes, str]]] = []
        with self._lock:
            for rid in reversed(self._uploads):
                kept = self._uploads[rid]
                if kept[1] == handed.queue and kept[3] != handed.job_id and location_of_job(kept[3]) == location:
                    taken.append((rid, kept))
                    if len(taken) == self.together - 1:
                        break
            for rid, kept in taken:
                del self._uploads[rid]
                self._claims[rid] = _Claim(kept)
        companions = []
        for rid, (upload, queue, raw, _job_id) in taken:
            try:
                body = dramatiq.Message.decode(raw).args[0]
            except Exception:  # not a message this actor can read: its own actor deals with it
                self.settle(rid, None)
                continue
            companions.append(Companion(rid, body, upload, self._ack(rid, queue)))
        return companions

    def settle(self, redis_message_id: str, settled: Any) -> None:
        """The outcome of a claimed message's import (None: its actor runs on its own)."""
        with self._lock:
            claim = self._claims.get(redis_message_id)
        if claim is None:
            return
        claim.settled = settled
        claim.done.set()

    def acked_by_script(self, message: Any) -> bool:
        rid = message.options.get("redis_message_id")
        if rid in self._acked:
            self._acked.discard(rid)
            return True
        return False
