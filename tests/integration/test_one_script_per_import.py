"""A small import (upload up to IMPORTER_ONE_STEP_MAX_BYTES) is one script call on
the worker: its upload comes with the fetched message (fetch.lua), the worker
validates it, then start_apply.lua starts the attempt, records 'validated',
applies, completes and acknowledges the dramatiq message. A larger one keeps
the separate steps (start, then apply; dramatiq's own ack). Both report the
same events. Counted under MONITOR on the real worker process."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis
from dramatiq.brokers.redis import _scripts as dramatiq_scripts

from importer.adapters.dramatiq import private
from importer.adapters.redis.records import stream_events, stream_id_key
from importer.adapters.redis.scripts import fetch_source, lua_source
from importer.domain.shipment import job_id_for
from importer.domain.stock import MAX_STOCK
from tests.integration.support import FIXTURES, System, stored_messages, wait_for

pytestmark = pytest.mark.integration

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()
BAD = (FIXTURES / "invalid-bad-quantity.csv").read_bytes()


def _sha(source: str | bytes) -> str:
    return hashlib.sha1(source.encode() if isinstance(source, str) else source).hexdigest()


class Monitor:
    """Top-level commands (not those run inside scripts) that name this system's keys."""

    def __init__(self, system: System) -> None:
        self.prefix = system.prefix
        self.client = redis.Redis.from_url(system.redis_url)
        self.commands: list[str] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        with self.client.monitor() as m:
            self._ready.set()
            for cmd in m.listen():
                if cmd.get("client_type") != "lua" and self.prefix in cmd["command"]:
                    self.commands.append(cmd["command"])
                if self._stop.is_set():
                    break

    def stop(self) -> list[str]:
        self._stop.set()
        self.client.ping()  # one more line for the listener to notice
        self._thread.join(10)
        return self.commands


def _script_calls(commands: list[str]) -> Counter[str]:
    names = {_sha(lua_source(n)): n for n in ("start", "apply", "start_apply", "fail")}
    names[_sha(fetch_source(private.dispatch_script()))] = "fetch"
    dispatch = _sha(dramatiq_scripts["dispatch"])
    calls: Counter[str] = Counter()
    for line in commands:
        words = line.split()
        if len(words) < 5 or words[0].upper() != "EVALSHA":
            continue
        sha = words[1]
        if sha == dispatch:
            calls["dramatiq " + words[3 + int(words[2])]] += 1  # EVALSHA sha numkeys namespace queue command ...
        else:
            calls[names.get(sha, sha)] += 1
    return calls


def _events(system: System, job_id: str) -> tuple[list[str], int]:
    """The job's events as GET /api/imports/{jobId}/events reads them (its own
    stream), checked against the global stream P:events: the same entries
    under the same ids, each event under an id of its own, in order. Returns
    them, and how many entries the job's stream has."""
    store = system.store()
    k = store.partition_of(job_id)
    events = store.job_events(job_id, "0-0", None)
    own = [(entry_id.decode(), fields) for entry_id, fields in store.client.xrange(k.job_events(job_id))]
    everyone = [(entry_id.decode(), fields) for entry_id, fields in store.client.xrange(k.events)
                if fields[b"jobId"].decode() == job_id]
    assert everyone == own
    assert events == [event for entry_id, fields in everyone for event in stream_events(entry_id, fields)]
    ids = [stream_id_key(e["id"]) for e in events]
    assert ids == sorted(set(ids)), ids
    kinds = [e["event"] if e["event"] != "progress" else json.dumps(e["data"], separators=(",", ":")) for e in events]
    return kinds, len(own)


@pytest.mark.parametrize(
    ("bound", "expected", "location"),
    [
        (str(16 * 1024), {"start_apply": 1}, "main"),
        # On one node another location's import is one script call too (its upload comes with the fetch).
        (str(16 * 1024), {"start_apply": 1}, "paris"),
        (str(len(SEED) - 1), {"start": 1, "apply": 1, "dramatiq ack": 1}, "main"),
    ],
    ids=["small-one-script", "small-one-script-at-another-location", "over-the-bound-separate-steps"],
)
def test_the_worker_calls_and_the_events_of_one_import(
    make_system: Any, bound: str, expected: dict[str, int], location: str,
) -> None:
    system: System = make_system(IMPORTER_ONE_STEP_MAX_BYTES=bound)
    system.start_http()
    system.start_worker(threads=1)
    # In the server's script cache already, as after any earlier import: a first
    # EVALSHA answered NOSCRIPT would be counted as a second call.
    client = redis.Redis.from_url(system.redis_url)
    for name in ("start", "apply", "start_apply", "fail"):
        client.script_load(lua_source(name))
    client.close()
    monitor = Monitor(system)
    try:
        query = "" if location == "main" else f"&location={location}"
        status, _, _ = system.request("POST", f"/api/imports?batchId=one-1{query}", body=SEED, ctype="text/csv")
        assert status == 202
        job_id = job_id_for("one-1", location)
        record = system.wait_state(job_id)
        # Acknowledged: the message is gone from dramatiq's message hash.
        wait_for(lambda: stored_messages(system) == 0, 10, message="the message acknowledged")
        time.sleep(0.3)
    finally:
        commands = monitor.stop()

    assert (record["state"], record["attempt"], record["progress"]) == ("completed", 1, {"phase": "committed", "rows": 3})
    assert record["result"] == {"imported": 3, "batchId": "one-1"}
    calls = _script_calls(commands)
    per_import = {name: n for name, n in calls.items() if name in ("start", "apply", "start_apply", "fail", "dramatiq ack")}
    assert per_import == expected, calls
    assert calls["fetch"] >= 1, calls  # the queue is fetched by fetch.lua (dramatiq's fetch inside), its delay queue by dramatiq
    kinds, entries = _events(system, job_id)
    assert kinds == [
        "waiting", "active", '{"phase":"validated","rows":3}', '{"phase":"committed","rows":3}', "completed",
    ]
    # One entry in the job's own stream per script call that changed the job:
    # the POST's, then the worker's one (start_apply) or two (start, apply).
    assert entries == 1 + sum(per_import.get(name, 0) for name in ("start", "apply", "start_apply"))
    assert system.store().stock_of(["WIDGET-RED-01"], location) == {"WIDGET-RED-01": 10}
    assert system.store().generation(location) == 1


def test_an_invalid_small_upload_fails_with_its_issues_and_its_message_is_rejected(make_system: Any) -> None:
    system: System = make_system()
    system.start_http()
    system.start_worker(threads=1)
    monitor = Monitor(system)
    try:
        assert system.post_csv("one-bad", BAD)[0] == 202
        record = system.wait_state("shipment-one-bad")
        wait_for(lambda: stored_messages(system) == 0, 10, message="the message rejected")
    finally:
        commands = monitor.stop()
    assert (record["state"], record["error"]["code"]) == ("failed", "csv.bad_quantity")
    # Validated before any attempt started; the failure takes the separate steps with its issues.
    calls = _script_calls(commands)
    assert (calls["start"], calls["fail"], calls["start_apply"], calls["apply"]) == (1, 1, 0, 0), calls
    assert calls["dramatiq nack"] == 1, calls
    assert _events(system, "shipment-one-bad")[0] == ["waiting", "active", "failed"]
    assert system.store().generation() == 0


def test_a_record_finished_in_one_step_has_the_fields_of_one_finished_in_separate_steps(make_system: Any) -> None:
    """start_apply.lua writes the start's fields of the record (attempt, token,
    lease cap, start times) in the apply's one HSET that ends the attempt: a
    record completed in one step has the fields of one completed in separate
    steps, and so has one that failed in one step (a stock overflow)."""
    system: System = make_system(IMPORTER_ONE_STEP_MAX_BYTES=str(len(SEED)))
    store = system.store()
    large = SEED + b"".join(b"FILLER-%04d,1\n" % i for i in range(40))  # over the bound: separate steps
    store.client.hset(store.partition_of(job_id_for("x")).stock, "NEARLY-FULL-01", MAX_STOCK - 1)
    system.start_http()
    system.start_worker(threads=1)
    batches = {"rec-one": SEED, "rec-separate": large, "rec-overflow": b"sku,quantity\nNEARLY-FULL-01,5\n"}
    for batch_id, body in batches.items():
        assert system.post_csv(batch_id, body)[0] == 202
    final = {batch_id: system.wait_state(job_id_for(batch_id)) for batch_id in batches}
    assert [final[b]["state"] for b in batches] == ["completed", "completed", "failed"]
    assert final["rec-overflow"]["error"]["code"] == "stock.overflow"

    def fields(batch_id: str) -> dict[str, str]:
        job_id = job_id_for(batch_id)
        raw = store.client.hgetall(store.partition_of(job_id).job(job_id))
        return {k.decode(): v.decode() for k, v in raw.items()}

    one, separate, overflow = (fields(b) for b in batches)
    assert set(one) == set(separate)
    for record in (one, separate, overflow):
        assert record["attempt"] == "1" and record["token"] and int(record["leaseCap"]) > int(record["startedAt"])
        assert int(record["attemptStartedAt"]) == int(record["startedAt"]) <= int(record["finishedAt"])
    assert store.stock_of(["NEARLY-FULL-01"]) == {"NEARLY-FULL-01": MAX_STOCK - 1}
