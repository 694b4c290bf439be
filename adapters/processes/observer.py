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

from importer.adapters.logs import log_event
from importer.adapters.redis.client import RedisClient
from importer.adapters.redis.keys import Keys
from importer.adapters.redis.records import events_after, text_of, xread_entries
from importer.domain.locations import MAIN

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
    """Follows the events stream of every location (each location's partition
    has its own, P:events): the registry of locations is read again every
    ``refresh_s``, so a location's first job shows up within that time.

    With one location (the usual install) it waits on that stream (a blocking
    XREAD). With several, one XREAD of each in one pipeline (on a cluster:
    one round trip per node; one XREAD of several streams would cross slots),
    then a pause of ``poll_s`` when none had anything new: the cost is one
    XREAD per location per pause, so 1,000 locations cost 5,000 cheap
    commands a second while the queue is idle."""

    def __init__(
        self,
        client: RedisClient,
        keys: Keys,
        out: TextIO,
        *,
        as_json: bool = False,
        start: str = "$",
        block_ms: int = 1000,
        poll_s: float = 0.2,
        refresh_s: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.keys = keys
        self.out = out
        self.as_json = as_json
        self.start = start
        self.block_ms = block_ms
        self.poll_s = poll_s
        self.refresh_s = refresh_s
        self.sleep = sleep

    def _resolve_start(self, events_key: str, start: str) -> str:
        """'$' means "from now": pin it to the current last id, so nothing written
        between start-up and the first read is missed."""
        if start != "$":
            return start
        last = self.client.xrevrange(events_key, count=1)
        return text_of(last[0][0]) if last else "0-0"

    def _streams(self, positions: dict[str, str], first: bool) -> None:
        """Adds the streams of locations registered since the last look (from
        the start asked for at start-up, from their beginning after it)."""
        others = sorted(text_of(v) for v in self.client.smembers(self.keys.locations))
        per_location = dict(p.split("=", 1) for p in self.start.split(",")) if "=" in self.start else {}
        for location in [MAIN, *others]:
            key = Keys(self.keys.prefix, location).events if location != MAIN else self.keys.events
            if key not in positions:
                # --from main=ID,paris=ID resumes each location after its own id
                # (a location it does not name: from its beginning); --from ID, every one after ID.
                start = per_location.get(location, "0-0") if per_location else (self.start if first else "0-0")
                positions[key] = self._resolve_start(key, start)
                log_event(log, "events.watching", location=location, stream_from=positions[key])

    def _read(self, positions: dict[str, str]) -> list[tuple[str, dict[str, Any]]]:
        """(stream, event) of what is new after each stream's position, in the
        order of each stream (an entry holds every event of one job's script
        call: common.lua, emit)."""
        if len(positions) == 1:
            ((key, after),) = positions.items()
            reply = self.client.xread({key: after}, count=500, block=self.block_ms)
            return [(key, event) for event in events_after(xread_entries(reply), after)]
        pipe = self.client.pipeline(transaction=False)
        for key, after in positions.items():
            pipe.xread({key: after}, count=500)
        found = [
            (key, event) for (key, after), reply in zip(positions.items(), pipe.execute())
            for event in events_after(xread_entries(reply), after)
        ]
        if not found:
            self.sleep(self.poll_s)
        return found

    def run(self, stop: threading.Event) -> int:
        positions: dict[str, str] = {}
        looked_at = -1e9
        backoff = 0.2
        while not stop.is_set():
            try:
                if time.monotonic() - looked_at >= self.refresh_s:
                    self._streams(positions, first=looked_at < 0)
                    looked_at = time.monotonic()
                found = self._read(positions)
                backoff = 0.2
            except (redis.ConnectionError, redis.TimeoutError):
                log_event(log, "events.reconnecting", logging.WARNING, retry_in_s=backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            for key, event in found:
                positions[key] = event["id"]
                line = json.dumps(event, separators=(",", ":")) if self.as_json else format_line(event)
                self.out.write(line + "\n")
            if found:
                self.out.flush()
        self.client.close()
        log_event(log, "events.closed", last_ids=positions)
        return 0
