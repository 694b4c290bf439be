"""Blame: a store outage is nobody's fault; a worker that vanishes is a stall.

* Three store outages, each landing on a running attempt of a valid import
  (redis-server SIGSTOPped for longer than the attempt lease and the socket
  timeout, then resumed), leave the import ``completed``, applied once: an
  attempt that lost its store is retried without counting.
* A worker SIGKILLed while it runs attempts, with the store up throughout, is
  a stall: counted apart (``stalls``), and the import completes on another
  worker; past IMPORTER_MAX_STALLS it fails with ``import.stalled``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from tests.faults.harness import FAULT_ENV
from tests.integration.support import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.integration]

ROWS = 20_000
SKUS = [f"BLAME-{n:05d}" for n in range(ROWS)]
BIG = b"sku,quantity\n" + b"".join(f"{sku},{1 + n % 7}\n".encode() for n, sku in enumerate(SKUS))
#: Each attempt waits before its apply, so an outage surely lands on a running
#: attempt (the outage itself is a real SIGSTOP of redis-server).
SLOW = "before_apply:1.5"
PAUSE_S = float(FAULT_ENV["IMPORTER_ATTEMPT_LEASE"]) + float(FAULT_ENV["IMPORTER_REDIS_SOCKET_TIMEOUT"]) + 1


def _record(client: redis.Redis, system: Any, job_id: str) -> dict[str, str]:
    raw = client.hgetall(f"{system.prefix}job:{job_id}")
    return {k.decode(): v.decode(errors="replace") for k, v in raw.items() if k != b"diagnostic"}


def _wait_active(client: redis.Redis, system: Any, job_id: str, attempt: int, timeout: float = 60) -> None:
    def active() -> bool:
        try:
            rec = _record(client, system, job_id)
        except redis.RedisError:
            return False
        return rec.get("state") == "active" and int(rec.get("attempt") or 0) >= attempt

    wait_for(active, timeout, 0.02, message=f"{job_id} active in attempt {attempt}")


def test_three_store_outages_on_running_attempts_do_not_fail_a_valid_import(make_redis: Any, make_faulty: Any) -> None:
    server = make_redis("everysec")
    system = make_faulty(server)
    system.start_worker(IMPORTER_FAULT=SLOW)
    system.start_http()
    client = server.client(timeout=2)
    status, body = system.post_csv("blame-1", BIG)
    assert status == 202, body
    job = "shipment-blame-1"
    seen_attempts = [0]
    for blip in range(3):
        # Each outage lands on a new running attempt (the one after the last outage's).
        _wait_active(client, system, job, seen_attempts[-1] + 1)
        seen_attempts.append(int(_record(client, system, job)["attempt"]))
        server.sigstop()
        time.sleep(PAUSE_S)
        server.sigcont()
        print(f"[blame] outage {blip + 1} on attempt {seen_attempts[-1]}, {PAUSE_S:.0f} s")
    record = system.wait_state(job, timeout=120)
    final = _record(client, system, job)
    print(f"[blame] final {record['state']} attempt={final.get('attempt')} outages={final.get('outages')} "
          f"stalls={final.get('stalls', '0')} error={record['error']}")
    assert record["state"] == "completed", record
    assert record["result"]["imported"] == ROWS
    assert int(final.get("outages") or 0) >= 1
    store = system.store()
    assert store.generation() == 1
    stock = store.stock_of(SKUS)
    assert stock == {sku: 1 + n % 7 for n, sku in enumerate(SKUS)}


def test_a_worker_that_vanishes_while_the_store_answers_is_a_stall(make_redis: Any, make_faulty: Any) -> None:
    server = make_redis("everysec")
    system = make_faulty(server, IMPORTER_MAX_STALLS="1")
    client = server.client(timeout=2)
    worker = system.start_worker(IMPORTER_FAULT="before_apply:30")
    system.start_http()
    assert system.post_csv("stall-1", BIG)[0] == 202
    assert system.post_csv("stall-2", BIG.replace(b"BLAME", b"STALL"))[0] == 202
    _wait_active(client, system, "shipment-stall-1", 1)
    worker.kill()  # SIGKILL the whole group: the store keeps answering
    # A worker that stalls too: both imports stall again on it.
    second = system.start_worker(IMPORTER_FAULT="before_apply:30")
    wait_for(lambda: int(_record(client, system, "shipment-stall-1").get("stalls") or 0) >= 1, 30, 0.1,
             message="the first stall counted")
    _wait_active(client, system, "shipment-stall-1", 2)
    second.kill()
    system.start_worker()  # healthy: its reconciler takes the stalled attempt back, a second stall
    record = system.wait_state("shipment-stall-1", timeout=60)
    final = _record(client, system, "shipment-stall-1")
    print(f"[blame] stalled twice: {record['state']} {record['error'] and record['error']['code']} "
          f"attempt={final.get('attempt')} stalls={final.get('stalls')} outages={final.get('outages', '0')}")
    assert record["state"] == "failed" and record["error"]["code"] == "import.stalled", record
    assert int(final["stalls"]) == 2
    # The healthy worker finishes the other import (or it stalled twice too).
    other = system.wait_state("shipment-stall-2", timeout=60)
    if other["state"] == "failed":
        assert other["error"]["code"] == "import.stalled", other
    assert system.store().generation() == (1 if other["state"] == "completed" else 0)
