"""GET /api/imports/{jobId}/events and GET /api/imports against real
`importer serve` (gunicorn, gthread) and `importer worker` processes on Redis:
ownership, Last-Event-ID resume, the end after the final event, the
per-process limit; the list's pages, owners and retention."""

from __future__ import annotations

import http.client
import json
import time
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.integration.support import FIXTURES, System, wait_for

pytestmark = pytest.mark.integration

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()


class Stream:
    """One open event stream, read line by line (http.client undoes the chunking)."""

    def __init__(self, system: System, job_id: str, *, key: str | None = None, last_event_id: str | None = None,
                 timeout: float = 30) -> None:
        url = urlsplit(system.base_url)
        self.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
        headers = {"Authorization": f"Bearer {key or system.api_key}"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        self.started = time.monotonic()
        self.conn.request("GET", f"/api/imports/{job_id}/events", headers=headers)
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.lines: list[str] = []

    def next_event(self) -> dict[str, Any] | None:
        """The next data message (comments skipped), or None when the server ended the stream."""
        fields: dict[str, str] = {}
        while True:
            raw = self.response.readline()
            if not raw:
                return None
            line = raw.decode().rstrip("\n")
            self.lines.append(line)
            if line == "":
                if "data" in fields:
                    event = json.loads(fields["data"])
                    assert fields.get("id", "") == event["id"]
                    return event
                fields = {}
            elif not line.startswith(":") and ": " in line:
                name, value = line.split(": ", 1)
                fields[name] = value

    def rest(self) -> list[dict[str, Any]]:
        out = []
        while (event := self.next_event()) is not None:
            out.append(event)
        return out

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def idle_system(make_system: Any) -> System:
    """HTTP only (no worker yet): jobs stay waiting until a test starts one."""
    system = make_system(IMPORTER_EVENT_STREAM_HEARTBEAT="1", IMPORTER_MAX_EVENT_STREAMS="2")
    system.start_http()
    return system


def test_stream_resumes_after_last_event_id_and_ends_after_the_final_event(idle_system: System) -> None:
    system = idle_system
    assert system.post_csv("es-1", SEED)[0] == 202
    first = Stream(system, "shipment-es-1")
    assert first.status == 200
    assert first.response.getheader("Content-Type") == "text/event-stream; charset=utf-8"
    waiting = first.next_event()
    assert waiting is not None and (waiting["event"], waiting["attempt"]) == ("waiting", 0)
    first.close()  # the client goes away after the first event

    system.start_worker()
    system.wait_state("shipment-es-1")
    resumed = Stream(system, "shipment-es-1", last_event_id=waiting["id"])
    events = resumed.rest()  # returns only because the server ends the stream
    resumed.close()
    assert [(e["event"], e["attempt"]) for e in events] == [
        ("active", 1), ("progress", 1), ("progress", 1), ("completed", 1),
    ]
    assert [e["data"].get("phase") for e in events[1:3]] == ["validated", "committed"]
    assert events[-1]["data"] == {"imported": 3, "batchId": "es-1"}
    assert all(e["id"] > waiting["id"] for e in events)
    # Resumed from inside the four events of the import's one script call
    # (one entry of the job's own stream): only those after it.
    mid = Stream(system, "shipment-es-1", last_event_id=events[1]["id"])
    assert [e["id"] for e in mid.rest()] == [e["id"] for e in events[2:]]
    mid.close()

    # A live follower sees the same, in order, then the end.
    assert system.post_csv("es-2", SEED.replace(b"10", b"11"))[0] == 202
    live = Stream(system, "shipment-es-2")
    kinds = [e["event"] for e in live.rest()]
    live.close()
    assert kinds == ["waiting", "active", "progress", "progress", "completed"]


def test_another_owner_gets_the_same_404_as_for_a_missing_job(idle_system: System) -> None:
    system = idle_system
    system.post_csv("es-own", SEED)
    theirs = system.request("GET", "/api/imports/shipment-es-own/events", key=system.other_key)
    missing = system.request("GET", "/api/imports/shipment-nope/events", key=system.other_key)
    status_404 = system.request("GET", "/api/imports/shipment-nope", key=system.other_key)
    assert theirs[0] == missing[0] == 404
    assert theirs[2] == missing[2] == status_404[2]
    assert json.loads(theirs[2])["code"] == "job.not_found"
    assert system.request("GET", "/api/imports/shipment-es-own/events", key=None)[0] == 401


def test_the_per_process_limit_answers_503_quickly_and_frees_slots(idle_system: System) -> None:
    system = idle_system  # IMPORTER_MAX_EVENT_STREAMS=2, one gunicorn worker
    system.post_csv("es-limit", SEED)
    held = [Stream(system, "shipment-es-limit") for _ in range(2)]
    assert [s.status for s in held] == [200, 200]
    for stream in held:
        assert stream.next_event()["event"] == "waiting"

    started = time.monotonic()
    status, headers, body = system.request("GET", "/api/imports/shipment-es-limit/events")
    assert status == 503 and json.loads(body)["code"] == "service.busy"
    assert headers["Retry-After"] == "5"
    assert time.monotonic() - started < 5
    # Ordinary requests are not starved by the open streams.
    assert system.request("GET", "/api/imports/shipment-es-limit")[0] == 200

    held[0].close()  # noticed at the next heartbeat write (1 s here)

    def a_stream_opens() -> bool:
        stream = Stream(system, "shipment-es-limit")
        opened = stream.status == 200
        if opened:
            held.append(stream)
        else:
            stream.response.read()
            stream.close()
        return opened

    wait_for(a_stream_opens, 30, 0.5, message="a freed slot")
    for stream in held:
        stream.close()


def test_a_quiet_stream_sends_heartbeats_and_ends_at_its_max_duration(make_system: Any) -> None:
    system = make_system(IMPORTER_EVENT_STREAM_HEARTBEAT="1", IMPORTER_EVENT_STREAM_MAX_DURATION="3")
    system.start_http()
    system.post_csv("es-quiet", SEED)
    stream = Stream(system, "shipment-es-quiet")
    events = stream.rest()
    elapsed = time.monotonic() - stream.started
    stream.close()
    assert [e["event"] for e in events] == ["waiting"]
    assert stream.lines.count(": heartbeat") >= 1
    assert ": max duration reached, reconnect with Last-Event-ID" in stream.lines
    assert 2.5 < elapsed < 20


def test_the_list_pages_through_the_callers_imports_only(system: System) -> None:
    for i in range(5):
        assert system.post_csv(f"ls-{i}", SEED.replace(b"10", str(20 + i).encode()))[0] == 202
    system.post_csv("ls-other", SEED, key=system.other_key)
    for i in range(5):
        system.wait_state(f"shipment-ls-{i}")

    seen: list[str] = []
    cursor = ""
    while True:
        status, _, body = system.request("GET", f"/api/imports?limit=2{'&cursor=' + cursor if cursor else ''}")
        assert status == 200
        page = json.loads(body)
        assert len(page["items"]) <= 2
        seen += [item["id"] for item in page["items"]]
        if not page["nextCursor"]:
            break
        cursor = page["nextCursor"]
    assert seen == [f"shipment-ls-{i}" for i in reversed(range(5))]
    item = json.loads(system.request("GET", "/api/imports?limit=1")[2])["items"][0]
    assert item == system.get_job(item["id"])[1]

    theirs = json.loads(system.request("GET", "/api/imports", key=system.other_key)[2])
    assert [item["id"] for item in theirs["items"]] == ["shipment-ls-other"]


def test_retention_removes_a_record_from_its_owners_list_and_its_event_stream(make_system: Any) -> None:
    system = make_system(IMPORTER_KEEP_COMPLETED_COUNT="1")
    system.start_worker()
    system.start_http()
    system.post_csv("rt-1", SEED)
    system.wait_state("shipment-rt-1")
    system.post_csv("rt-2", SEED.replace(b"10", b"12"))
    system.wait_state("shipment-rt-2")
    # Retention runs in the reconciler's pass (every 0.5 s here).
    wait_for(lambda: system.get_job("shipment-rt-1")[0] == 404, 10, message="retention")
    ids = [item["id"] for item in json.loads(system.request("GET", "/api/imports")[2])["items"]]
    assert ids == ["shipment-rt-2"]
    store = system.store()
    assert store.client.zcard(store.keys.owner_jobs("owner-a")) == 1
    assert not store.client.exists(store.keys.job_events("shipment-rt-1"))
    assert store.client.exists(store.keys.job_events("shipment-rt-2"))


def _submit_wait(system: System, batch_id: str, *extra: str) -> Any:
    import subprocess
    import sys

    from tests.integration.support import ROOT

    env = {**system.env, "IMPORTER_API_KEY": system.api_key, "IMPORTER_URL": system.base_url}
    return subprocess.run(
        [sys.executable, "-m", "importer.adapters.processes.cli", "submit", str(FIXTURES / "shipment-a-2026.csv"),
         "--batch-id", batch_id, "--wait", *extra],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )


def test_submit_wait_prints_every_milestone_from_the_stream(system: System) -> None:
    out = _submit_wait(system, "cli-live")
    assert out.returncode == 0, out.stdout + out.stderr
    shown = [line.split(" elapsed=")[0] for line in out.stdout.splitlines()[1:-1]]
    # Polling could miss the short-lived 'validated'; the stream delivers each event.
    assert shown == [
        "waiting   phase=- rows=- attempt=0",
        "active    phase=- rows=- attempt=1",
        "active    phase=validated rows=3 attempt=1",
        "active    phase=committed rows=3 attempt=1",
        "completed phase=committed rows=3 attempt=1",
    ], out.stdout
    assert out.stdout.splitlines()[-1] == 'completed shipment-cli-live: {"imported": 3, "batchId": "cli-live"}'


def test_submit_wait_falls_back_to_polling_when_no_stream_is_allowed(make_system: Any) -> None:
    system = make_system(IMPORTER_MAX_EVENT_STREAMS="0")
    system.start_worker()
    system.start_http()
    assert system.request("GET", "/api/imports/shipment-x/events")[0] == 404
    out = _submit_wait(system, "cli-poll")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == 'completed shipment-cli-poll: {"imported": 3, "batchId": "cli-poll"}'


def test_a_stopping_server_ends_its_streams_and_exits_cleanly(make_system: Any) -> None:
    system = make_system(IMPORTER_EVENT_STREAM_HEARTBEAT="1", IMPORTER_HTTP_DRAIN_DELAY="1")
    http_proc = system.start_http()
    system.post_csv("es-stop", SEED)
    stream = Stream(system, "shipment-es-stop")
    assert stream.next_event()["event"] == "waiting"
    started = time.monotonic()
    http_proc.popen.send_signal(15)  # SIGTERM
    assert stream.rest() == []  # the server ended the stream
    stream.close()
    assert ": server closing, reconnect with Last-Event-ID" in stream.lines
    assert http_proc.popen.wait(timeout=30) == 0
    assert time.monotonic() - started < 20
