"""``importer events``: the queue-wide observer (BullMQ's QueueEvents).

Reads the events stream that every state change writes in the same Lua step
as the record change, and prints one line per event. Events are signals; the
stored record (GET /api/imports/{jobId}) is the truth.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

import redis

from importer.adapters.redis.client import RedisClient
from importer.adapters.logs import log_event
from importer.adapters.redis.records import event_dict, text_of, xread_entries

log = logging.getLogger("importer.events")


def format_line(event: dict[str, Any]) -> str:
    """One readable line: ``progress shipment-x {"phase":"validated","rows":3} attempt=1``."""
    kind, job, attempt, data = event["event"], event["jobId"], event["attempt"], event["data"]
    if kind == "progress":
        return f"{kind} {job} {json.dumps(data, separators=(',', ':'))} attempt={attempt}"
    if kind in ("failed", "retrying"):
        code = data.get("code", "") if isinstance(data, dict) else ""
        return f"{kind} {job} {code} attempt={attempt}"
    if kind == "active":
        return f"{kind} {job} attempt={attempt}"
    if kind == "waiting" and isinstance(data, dict) and data.get("retry"):
        return f"{kind} {job} retry={data['retry']}"  # its owner retried it: a new attempt chain
    return f"{kind} {job}"


class EventsObserver:
    def __init__(
        self,
        client: RedisClient,
        events_key: str,
        out: TextIO,
        *,
        as_json: bool = False,
        start: str = "$",
        block_ms: int = 1000,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.events_key = events_key
        self.out = out
        self.as_json = as_json
        self.start = start
        self.block_ms = block_ms
        self.sleep = sleep

    def _resolve_start(self) -> str:
        """'$' means "from now": pin it to the current last id, so nothing written
        between start-up and the first read is missed."""
        if self.start != "$":
            return self.start
        last = self.client.xrevrange(self.events_key, count=1)
        return text_of(last[0][0]) if last else "0-0"

    def run(self, stop: threading.Event) -> int:
        last: str | None = None
        backoff = 0.2
        while not stop.is_set():
            try:
                if last is None:
                    last = self._resolve_start()
                    log_event(log, "events.watching", stream_from=last)
                reply = self.client.xread({self.events_key: last}, count=500, block=self.block_ms)
                backoff = 0.2
            except (redis.ConnectionError, redis.TimeoutError):
                log_event(log, "events.reconnecting", logging.WARNING, after_id=last, retry_in_s=backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            for last, fields in xread_entries(reply):
                event = event_dict(last, fields)
                line = json.dumps(event, separators=(",", ":")) if self.as_json else format_line(event)
                self.out.write(line + "\n")
            if reply:
                self.out.flush()
        self.client.close()
        log_event(log, "events.closed", last_id=last)
        return 0
