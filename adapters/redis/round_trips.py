"""Group commit for the store's scripts: the calls that threads of one process
make at the same time to one node share one round trip
(ThreadConnections.run_script_shared, adapters/redis/client.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import redis


class SharedRoundTrips:
    """Group commit: calls that threads of one process make at the same time
    share one round trip.

    A caller that finds no round trip on its way leads one at once with its
    own call (a lone call waits for nobody). Callers that arrive while one is
    on its way queue; when it ends, its leader hands each of its calls its
    reply, and the first call queued since leads the next round trip with
    every call queued by then. Each caller gets its own reply or error. When
    no call of a round trip got an answer (a timeout, a lost connection that
    a resend did not mend), the calls queued behind it fail with it: a call
    waits at most about one socket timeout. A leader interrupted by a
    BaseException (not an Exception) raises it; its followers get a
    ConnectionError, which means "not known to have run" (the store answers
    503; a retry of the same call is safe).

    Each waiting call sleeps on a lock of its own, and a round trip's end
    wakes only the threads that have something to do: its followers and the
    next leader. (A shared condition woke every waiting thread on every round
    trip, each of them then contending for the condition's lock: under load,
    that notify_all was about a tenth of an HTTP process's CPU, py-spy --gil.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued: list[_SharedCall] = []
        self._sending = False
        #: Round trips led and calls they carried (for tests and the bench).
        self.round_trips = 0
        self.calls = 0

    def call(self, request: Any, send: Callable[[list[Any]], list[Any]]) -> Any:
        """``request``'s reply (an exception is returned, not raised): sent by
        this thread with those queued meanwhile (``send`` gets them all, in
        order, and returns one reply each), or by another thread's round trip."""
        mine = _SharedCall(request)
        with self._lock:
            if self._sending:
                mine.wake = threading.Lock()
                mine.wake.acquire()
                self._queued.append(mine)
                batch = None
            else:
                self._sending = True
                batch = [mine]
                self.round_trips += 1
                self.calls += 1
        if batch is None:
            mine.wake.acquire()  # released by the leader: with a reply, or to lead (mine first in the queue)
            if mine.done:
                return mine.reply
            with self._lock:
                batch, self._queued = self._queued, []
                self.round_trips += 1
                self.calls += len(batch)
        replies: list[Any] | None = None
        try:
            replies = send([c.request for c in batch])
        except Exception as exc:  # noqa: BLE001 - every call of the round trip gets it
            replies = [exc] * len(batch)
        finally:
            if replies is None:
                # A BaseException interrupted the leader (it raises that itself): its followers' answer.
                replies = [redis.ConnectionError("the round trip was interrupted")] * len(batch)
            for c, reply in zip(batch, replies):
                c.reply, c.done = reply, True
            with self._lock:
                woken = batch[1:]
                if all(isinstance(r, _AWAY) for r in replies):
                    # The store did not answer this round trip: the calls queued
                    # behind it fail now, rather than each wait a timeout more.
                    for c in self._queued:
                        c.reply, c.done = redis.ConnectionError("the store did not answer the round trip ahead"), True
                    woken += self._queued
                    self._queued = []
                if self._queued:
                    woken.append(self._queued[0])  # not done: it leads the next round trip
                else:
                    self._sending = False
            for c in woken:
                c.wake.release()
        return mine.reply


#: Errors after which a round trip's store is taken as away (timed out, or unreachable even when sent again).
_AWAY = (redis.TimeoutError, redis.ConnectionError)


class _SharedCall:
    __slots__ = ("request", "reply", "done", "wake")

    def __init__(self, request: Any) -> None:
        self.request = request
        self.reply: Any = None
        self.done = False
        #: Held while the call waits in the queue; released to wake it.
        self.wake: Any = None
