"""Follows one import through ``GET /api/imports/{jobId}/events`` (Server-Sent
Events) for ``importer submit --wait``.

It reads the stream with the standard library, reconnects with
``Last-Event-ID`` when the server ends a stream before the final event (its
maximum duration, a restart), and says "unavailable" when there is no stream
to read (an older server, a serverless deployment answering 501, a busy
process answering 503, a proxy in the way): the caller then polls.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, Literal

from importer.domain.jobs import FINISHED_STATES, JobState

#: Seconds without a byte before the connection is given up (the server sends a heartbeat every 15 s).
READ_TIMEOUT_S = 45.0

_STATES = frozenset(JobState)

Outcome = Literal["finished", "unavailable", "timeout"]


def apply_event(view: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
    """The job as last seen: state, attempt, progress, after one event."""
    out = dict(view, attempt=event.get("attempt", view.get("attempt", 0)))
    kind, data = event.get("event"), event.get("data") or {}
    if kind in _STATES:
        out["state"] = kind
    if kind in ("active", "waiting"):  # a new attempt, or a retry's new chain
        out["progress"] = None
    elif kind == "progress":
        out["progress"] = data
        if out.get("state") == "waiting":
            out["state"] = "active"
    return out


def _messages(response: Any) -> Any:
    """Yield each SSE data message of a response as a dict (comments and retry lines skipped)."""
    fields: dict[str, str] = {}
    for raw in response:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if line == "":
            if "data" in fields:
                yield json.loads(fields["data"])
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value


def follow_stream(
    url: str, key: str, job_id: str, *, deadline: float, on_event: Callable[[dict[str, Any]], None],
    clock: Callable[[], float] = time.monotonic, attempts: int = 5,
) -> Outcome:
    """Read the job's events until its final one, calling on_event for each.

    "finished": the final event arrived (read the record for the result);
    "unavailable": no stream here, poll instead; "timeout": the deadline passed.
    The final event is the last one of the stream the server ends after it:
    a retried import's history holds an earlier chain's ``failed`` with the
    retry's events after it, in the same stream.
    """
    last_id = ""
    failures = 0
    path = f"{url}/api/imports/{urllib.parse.quote(job_id)}/events"
    while clock() < deadline:
        request = urllib.request.Request(path, headers={"Authorization": f"Bearer {key}", "Accept": "text/event-stream"})
        if last_id:
            request.add_header("Last-Event-ID", last_id)
        try:
            read_timeout = min(READ_TIMEOUT_S, max(0.5, deadline - clock()))
            with urllib.request.urlopen(request, timeout=read_timeout) as response:
                if not response.headers.get("Content-Type", "").startswith("text/event-stream"):
                    return "unavailable"
                finished = False
                for event in _messages(response):
                    if event.get("id"):
                        last_id = event["id"]
                    on_event(event)
                    failures = 0
                    finished = event.get("event") in FINISHED_STATES
                    if clock() >= deadline:
                        return "finished" if finished else "timeout"
                if finished:
                    return "finished"
        except urllib.error.HTTPError as err:
            err.close()
            return "unavailable"  # 404 from an older server, 501 serverless, 503 busy: the caller polls
        except (OSError, ValueError):
            if clock() >= deadline:
                return "timeout"
            failures += 1
            if failures >= attempts:
                return "unavailable"
            time.sleep(min(2.0, 0.2 * 2**failures))
        # The server ended the stream before the final event (its maximum
        # duration, or it is shutting down): reconnect after the last id.
    return "timeout"
