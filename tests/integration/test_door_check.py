"""No job accepted that no worker can run.

Real `importer serve` (IMPORTER_PRODUCER_VERSION=2) and real `importer worker`
processes with different IMPORTER_ACCEPTED_VERSIONS, on both message
transports: a POST is refused with 503 contract.no_worker when live workers
exist and none accepts version 2, and then nothing is recorded; it is
accepted when one live worker accepts it, and when no worker is alive at all
(also once a SIGKILLed non-matching worker's liveness window has passed).
/health and `importer doctor` say what the door sees. And enqueue.lua decides
as domain/contract.py's live_workers_can_run does, on random worker sets.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, event, given, settings as hsettings, strategies as st

from importer.adapters.settings import Settings
from importer.domain.contract import live_workers_can_run
from tests.integration.support import FIXTURES, ROOT, ProbeStore, System, queued_messages, stored_messages, wait_for

pytestmark = pytest.mark.integration

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()
V2 = {"IMPORTER_PRODUCER_VERSION": "2"}


@pytest.fixture(params=["redis", "rabbitmq"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def health_workers(system: System) -> dict[str, Any]:
    status, _, body = system.request("GET", "/health", key=None)
    assert status == 200, body
    return json.loads(body)["workers"]  # type: ignore[no-any-return]


def doctor(system: System, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "importer.adapters.processes.cli", "doctor"], env={**system.env, **env}, cwd=ROOT,
        capture_output=True, text=True, timeout=30,
    )


def post(system: System, batch_id: str) -> tuple[int, dict[str, str], dict[str, Any]]:
    status, headers, body = system.request(
        "POST", f"/api/imports?batchId={batch_id}", body=SEED, ctype="text/csv"
    )
    return status, headers, json.loads(body)


def assert_nothing_recorded(system: System, batch_id: str) -> None:
    client = redis.Redis.from_url(system.redis_url)
    store = system.store()
    keys = store.keys
    assert not client.exists(keys.job(f"shipment-{batch_id}"))
    tagged = system.prefix.replace("{", "\\{").replace("}", "\\}")
    assert list(client.scan_iter(match=tagged + "upload:*", count=1000)) == []
    assert client.zcard(keys.waiting) == client.zcard(keys.unsent) == client.zcard(keys.deadline) == 0
    assert client.zcard(keys.owner_jobs("owner-a")) == 0
    assert client.xlen(keys.events) == 0
    assert queued_messages(system) == 0
    assert stored_messages(system) in (0, None)


def assert_refused(system: System, batch_id: str, accepted: list[int]) -> None:
    status, headers, body = post(system, batch_id)
    assert status == 503, body
    assert headers["Content-Type"] == "application/problem+json"
    assert headers["Retry-After"] == "5"
    assert body["code"] == "contract.no_worker"
    assert body["producerVersion"] == 2 and body["acceptedVersions"] == accepted
    assert "contract version 2" in body["detail"] and "version 1" in body["detail"]
    assert_nothing_recorded(system, batch_id)


def test_two_workers_of_different_versions(make_system: Any) -> None:
    system: System = make_system()
    old = system.start_worker(IMPORTER_ACCEPTED_VERSIONS="1")
    system.start_http(**V2)

    # Only a worker that cannot read version 2 is alive: refused at the door, nothing recorded.
    assert health_workers(system) == {"alive": 1, "acceptedVersions": [1], "producerVersion": 2, "acceptsImports": False}
    assert_refused(system, "door-1", [1])
    checklist = doctor(system, **V2)
    assert checklist.returncode == 1, checklist.stdout
    assert "[FAIL] door check: no live worker accepts producer version 2" in checklist.stdout
    assert "worker contract versions: 1 live:" in checklist.stdout and "accepts 1" in checklist.stdout

    # A worker that accepts 1 and 2 joins: the same POST is accepted.
    new = system.start_worker(IMPORTER_ACCEPTED_VERSIONS="1,2", IMPORTER_LOG_LEVEL="debug")  # import.applied: a debug line
    assert health_workers(system) == {"alive": 2, "acceptedVersions": [1, 2], "producerVersion": 2, "acceptsImports": True}
    checklist = doctor(system, **V2)
    assert checklist.returncode == 0, checklist.stdout
    assert "[  ok] door check: producer version 2 (IMPORTER_PRODUCER_VERSION) is accepted by 1 live worker(s)" in checklist.stdout
    # The old worker stays live (its presence holds for the window) but takes
    # no message: frozen, so that only the new one can run the job.
    old.signal(signal.SIGSTOP)
    status, headers, body = post(system, "door-1")
    assert status == 202, body
    assert health_workers(system)["alive"] == 2  # both were live when the POST passed the door
    old.kill()
    record = system.wait_state("shipment-door-1")
    assert record["state"] == "completed", record
    # Version 2 carries the POST's request id to the worker's log lines.
    request_id = headers["X-Request-Id"]
    wait_for(lambda: request_id in new.log(), 10, message="the request id in the worker's log")

    # A worker that stops cleanly leaves at once: no worker alive, and a POST is accepted and waits.
    # (First the killed old one's window passes: it said no goodbye.)
    wait_for(lambda: health_workers(system)["alive"] == 1, 10, message="the killed worker's window to pass")
    new.stop()
    assert health_workers(system) == {"alive": 0, "acceptedVersions": [], "producerVersion": 2, "acceptsImports": True}
    status, _, body = post(system, "door-2")
    assert status == 202 and body["state"] == "waiting", body
    time.sleep(0.5)
    assert system.get_job("shipment-door-2")[1]["state"] == "waiting"
    checklist = doctor(system, **V2)
    assert "[warn] worker contract versions: no worker alive: imports are accepted and wait for a worker" in checklist.stdout


def test_a_killed_worker_stops_counting_after_its_window(make_system: Any) -> None:
    system: System = make_system()
    old = system.start_worker(IMPORTER_ACCEPTED_VERSIONS="1")
    system.start_http(**V2)
    assert_refused(system, "door-k", [1])
    # What `importer submit` tells the person at the terminal.
    submit = subprocess.run(
        [sys.executable, "-m", "importer.adapters.processes.cli", "submit", str(FIXTURES / "shipment-a-2026.csv"),
         "--batch-id", "door-k", "--url", system.base_url],
        env={**system.env, "IMPORTER_API_KEY": system.api_key}, cwd=ROOT, capture_output=True, text=True, timeout=30,
    )
    assert submit.returncode == 1
    assert submit.stderr.startswith(
        "refused: 503 contract.no_worker: Nothing was recorded: this server sends queue messages of contract version 2, "
        "and the workers running now accept only version 1."
    ), submit.stderr
    assert_nothing_recorded(system, "door-k")

    old.kill()  # SIGKILL: no goodbye; its entry expires after IMPORTER_HEARTBEAT_TIMEOUT (3 s here)
    killed_at = time.monotonic()
    wait_for(lambda: health_workers(system)["alive"] == 0, 10, 0.1, message="the killed worker's window to pass")
    waited = time.monotonic() - killed_at
    status, _, body = post(system, "door-k")
    assert status == 202 and body["state"] == "waiting", (body, waited)
    print(f"killed worker no longer counted after {waited:.1f} s (window 3 s)")


# -- enqueue.lua decides as the domain does -------------------------------------------------

VERSION_SETS = st.frozensets(st.integers(1, 4), min_size=1, max_size=3)
WORKERS = st.lists(st.tuples(VERSION_SETS, st.booleans()), max_size=5)  # (accepts, live)


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(version=st.integers(1, 4), workers=WORKERS)
def test_the_script_and_the_domain_agree(redis_url: str, version: int, workers: list[tuple[frozenset[int], bool]]) -> None:
    client = redis.Redis.from_url(redis_url)
    prefix = "{d" + uuid.uuid4().hex[:12] + "}:"
    # Settings built directly are not checked against KNOWN_VERSIONS: the script takes any version.
    store = ProbeStore(client, Settings(key_prefix=prefix, producer_version=version), clock_ms=lambda: 1_000)
    try:
        # The live ones first; then the others with a 1 ms window, so that
        # their entries are still there (no later beat prunes them), expired.
        for n, (accepts, live) in sorted(enumerate(workers), key=lambda item: not item[1][1]):
            store.announce_worker(f"w{n}", accepts, 60_000 if live else 1)
        time.sleep(0.005)
        live_sets = [accepts for accepts, live in workers if live]
        assert sorted(store.live_workers().values(), key=sorted) == sorted(live_sets, key=sorted)

        outcome = store.enqueue(
            job_id="shipment-b", batch_id="b", owner="o", content_sha256="x", upload_id="0" * 32, csv=b"sku,quantity\n"
        )
        event(outcome.kind)
        if live_workers_can_run(version, live_sets):
            assert outcome.kind == "created"
        else:
            assert outcome.kind == "no_worker"
            assert outcome.producer_version == version
            assert outcome.workers_accept == frozenset().union(*live_sets)
            assert not client.exists(store.keys.job("shipment-b"), store.keys.upload("0" * 32))
            assert client.zcard(store.keys.unsent) == 0
    finally:
        keys = list(client.scan_iter(match=prefix.replace("{", "\\{").replace("}", "\\}") + "*", count=1000))
        if keys:
            client.delete(*keys)


def test_presence_prunes_expired_workers_and_a_worker_can_leave(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    prefix = "{d" + uuid.uuid4().hex[:12] + "}:"
    store = ProbeStore(client, Settings(key_prefix=prefix), clock_ms=lambda: 1_000)
    try:
        assert store.announce_worker("gone", frozenset({1}), 1) == 1
        time.sleep(0.01)
        assert store.announce_worker("here", frozenset({1, 2}), 60_000) == 1  # "gone" pruned
        assert client.hkeys(store.keys.workers_accepts) == [b"here"]
        assert store.live_workers() == {"here": frozenset({1, 2})}
        assert client.zrange(store.keys.workers_accepting(1), 0, -1) == [b"here"]  # "gone" pruned there too
        assert client.zrange(store.keys.workers_accepting(2), 0, -1) == [b"here"]
        store.remove_worker("here")
        assert store.live_workers() == {}
        assert client.exists(
            store.keys.workers, store.keys.workers_accepts, store.keys.workers_accepting(1), store.keys.workers_accepting(2)
        ) == 0
    finally:
        client.delete(store.keys.workers, store.keys.workers_accepts, store.keys.workers_accepting(1), store.keys.workers_accepting(2))
