"""A job's live events as ``text/event-stream`` (Server-Sent Events), with a
bounded cost per open stream.

What one open stream costs this process: one thread of the WSGI server (it
iterates :class:`JobEventStream`), one slot of :class:`EventStreams` (at most
``limit`` per process; one more is refused with ``503 service.busy`` at once),
and at any time at most one Redis read: ``XREAD BLOCK`` of that job's own
event stream for at most ``block_s`` (below the Redis client's socket
timeout), so a Redis connection from the pool while it waits. Every
``heartbeat_s`` without an event it writes a comment line (which is also how
a vanished client is noticed) and re-reads the job record (one HGETALL).
After ``max_duration_s`` it ends; the client reconnects with
``Last-Event-ID`` and misses nothing. It ends after the job's final event
(completed or failed) when no event follows it (a retried import's history
holds the earlier chain's ``failed``, then ``waiting`` with ``{"retry": n}``:
the stream goes on), and when the process begins to shut down.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from importer.domain.jobs import FINISHED_STATES, JobRecord
from importer.domain.ports import JobEventSource

log = logging.getLogger("importer.http")

#: A Redis stream id, as given back by the client in Last-Event-ID.
STREAM_ID = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}$")


class StreamSlots:
    """At most ``limit`` streams open at once in this process (0 = none allowed)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._open = 0

    def try_acquire(self) -> bool:
        with self._lock:
            if self._open >= self.limit:
                return False
            self._open += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._open = max(0, self._open - 1)

    @property
    def open(self) -> int:
        return self._open


@dataclass
class EventStreams:
    """Settings and the per-process slot counter of the event streams."""

    limit: int = 32
    heartbeat_s: float = 15.0
    max_duration_s: float = 300.0
    #: Longest single blocking read; must stay below the Redis socket timeout (10 s).
    block_s: float = 5.0
    #: Milliseconds the client waits before reconnecting (SSE ``retry:``).
    retry_ms: int = 2000
    clock: Callable[[], float] = time.monotonic
    slots: StreamSlots = field(init=False)

    def __post_init__(self) -> None:
        self.slots = StreamSlots(self.limit)


def sse_event(event: dict[str, Any]) -> bytes:
    """One SSE message: ``id`` = the Redis stream id, ``event`` = the kind, ``data`` = the whole event as JSON."""
    data = json.dumps(event, separators=(",", ":"))
    head = f"id: {event['id']}\n" if event["id"] else ""
    return f"{head}event: {event['event']}\ndata: {data}\n\n".encode()


def final_event_from_record(record: JobRecord) -> dict[str, Any]:
    """The final event told from the record, for a finished job whose stored events are gone.

    It carries no id (the SSE ``id:`` line is left out, so the client keeps
    the last id it had)."""
    return {
        "id": "",
        "event": record.state,
        "jobId": record.id,
        "batchId": record.batch_id,
        "attempt": record.attempt,
        "data": (record.result if record.state == "completed" else record.error) or {},
    }


class JobEventStream:
    """The body of ``GET /api/imports/{jobId}/events``; holds a slot until closed.

    The WSGI server calls close() when the response ends for any reason
    (finished, client gone, server error); so does the serverless transport,
    which cannot stream."""

    def __init__(
        self,
        source: JobEventSource,
        config: EventStreams,
        record: JobRecord,
        after_id: str,
        *,
        closing: Callable[[], bool],
        unavailable_errors: tuple[type[BaseException], ...],
        on_store_error: Callable[[], None],
    ) -> None:
        self.source = source
        self.config = config
        self.record = record
        self.after_id = after_id
        self.closing = closing
        self.unavailable_errors = unavailable_errors
        self.on_store_error = on_store_error
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.config.slots.release()

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._events()
        except self.unavailable_errors:
            self.on_store_error()
            log.warning("store unavailable", extra={"event": "http.stream_store_unavailable", "jobId": self.record.id})
            # The client reconnects (retry:) with Last-Event-ID and misses nothing.
            yield b": store unavailable, reconnect\n\n"

    def _events(self) -> Iterator[bytes]:
        cfg, job_id = self.config, self.record.id
        yield f"retry: {cfg.retry_ms}\n: stream of {job_id}\n\n".encode()
        started = last_write = cfg.clock()
        cursor = self.after_id
        # What is stored already, without waiting. A final event ends the
        # stream only when it is the last one (a retry's events may follow it).
        stored = self.source.job_events(job_id, cursor, None)
        for event in stored:
            cursor = event["id"]
            yield sse_event(event)
        if stored and stored[-1]["event"] in FINISHED_STATES:
            return
        if self.record.state in FINISHED_STATES:
            # Events after the record was read mean it was retried since: read it
            # again before telling the end from it.
            record = self.source.get_owned_job(job_id, self.record.owner) if stored else self.record
            if record is None:
                yield b": the job record is gone\n\n"
                return
            if record.state in FINISHED_STATES:
                # Finished, but its final event is not stored (trimmed, or older than
                # the per-job streams): tell it from the record, then end.
                yield sse_event(final_event_from_record(record))
                return
        while not self.closing():
            now = cfg.clock()
            remaining = cfg.max_duration_s - (now - started)
            if remaining <= 0:
                yield b": max duration reached, reconnect with Last-Event-ID\n\n"
                return
            until_heartbeat = cfg.heartbeat_s - (now - last_write)
            block_s = max(0.001, min(cfg.block_s, remaining, max(until_heartbeat, 0.001)))
            events = self.source.job_events(job_id, cursor, max(1, int(block_s * 1000)))
            for event in events:
                cursor = event["id"]
                yield sse_event(event)
                last_write = cfg.clock()
            if events and events[-1]["event"] in FINISHED_STATES:
                return
            if not events and cfg.clock() - last_write >= cfg.heartbeat_s:
                record = self.source.get_owned_job(job_id, self.record.owner)
                if record is None:
                    yield b": the job record is gone\n\n"
                    return
                if record.state in FINISHED_STATES:
                    # Its final event was missed (trimmed): read once more, else tell it from the record.
                    events = self.source.job_events(job_id, cursor, None)
                    for event in events:
                        cursor = event["id"]
                        yield sse_event(event)
                    if not events:
                        yield sse_event(final_event_from_record(record))
                        return
                    if events[-1]["event"] in FINISHED_STATES:
                        return
                    last_write = cfg.clock()  # retried since: its new chain goes on
                    continue
                yield b": heartbeat\n\n"
                last_write = cfg.clock()
        yield b": server closing, reconnect with Last-Event-ID\n\n"
