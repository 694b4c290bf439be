"""Bounded waits on RabbitMQ, from outside: a blocked (memory alarm), silent
(SIGSTOP) or dead (SIGKILL) broker makes a POST answer `503
service.unavailable` with `Retry-After` within the README's bound (the socket
timeout + 1 s), and /health say which dependency is sick; once the broker is
back, every job recorded meanwhile completes, once.

Before the fix, with the memory alarm raised, a POST answered 503 after 60 s
(dramatiq tried the publish 6 times, each blocked for 10 s) and /health said
200 all along.

The node is the test's own (tests/integration/rabbitmq_node.py), never the
machine's RabbitMQ on 5672.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest

from importer.adapters.dramatiq.rabbitmq import BoundedRabbitmqBroker
from tests.integration.rabbitmq_node import RabbitNode, wait_until_blocked_or_clear
from tests.integration.rabbitmq_node import module_node, node  # noqa: F401 (fixtures)
from tests.integration.support import System, wait_for

pytestmark = pytest.mark.integration

#: A short socket timeout, so that the bound is short: every wait on the broker ends within it.
SOCKET_TIMEOUT = 2.0
#: The README's promise: a request answers within the socket timeout + 1 s.
REQUEST_BOUND = SOCKET_TIMEOUT + 1


@pytest.fixture
def system(node: RabbitNode, redis_url: str, tmp_path: Path) -> Iterator[System]:
    system = System(redis_url, tmp_path, transport="rabbitmq", env_overrides={
        "IMPORTER_BROKER_URL": node.url,
        "IMPORTER_REDIS_SOCKET_TIMEOUT": str(SOCKET_TIMEOUT),
        "IMPORTER_WAITING_GRACE": "1",
    })
    try:
        system.start_worker()
        system.start_http()
        yield system
    finally:
        node.resume()
        system.stop_all()


def timed(call: Any) -> tuple[Any, float]:
    started = time.monotonic()
    value = call()
    return value, time.monotonic() - started


def health(system: System) -> tuple[int, str, float]:
    (status, _, body), seconds = timed(lambda: system.request("GET", "/health", key=None))
    return status, json.loads(body).get("reason", ""), seconds


def post(system: System, batch_id: str, csv: bytes) -> tuple[int, dict[str, str], Any, float]:
    path = f"/api/imports?batchId={batch_id}"
    (status, headers, body), seconds = timed(lambda: system.request("POST", path, body=csv, ctype="text/csv"))
    return status, headers, json.loads(body), seconds


def health_says(system: System, reason: str, timeout: float = 20) -> float:
    """Polls /health until it answers 503 with ``reason`` (200 when reason is ''); the longest answer's time."""
    slowest = [0.0]

    def says() -> bool:
        status, seen, seconds = health(system)
        slowest[0] = max(slowest[0], seconds)
        return (status, seen) == ((503, reason) if reason else (200, ""))

    wait_for(says, timeout, 0.1, message=f"/health saying {reason or 'ok'}")
    return slowest[0]


def assert_503_within_bound(system: System, batch_id: str, csv: bytes) -> float:
    status, headers, problem, seconds = post(system, batch_id, csv)
    assert (status, problem.get("code")) == (503, "service.unavailable"), problem
    assert headers.get("Retry-After"), headers
    assert seconds <= REQUEST_BOUND, f"the POST answered after {seconds:.1f}s"
    return seconds


def test_memory_alarm_503_within_the_bound_then_every_job_completes_once(node: RabbitNode, system: System) -> None:
    status, _, accepted, _ = post(system, "before-alarm", b"sku,quantity\nBOUND-A,1\n")
    assert status == 202, accepted
    system.wait_state("shipment-before-alarm")
    assert health(system)[:2] == (200, "")

    node.raise_memory_alarm()
    wait_until_blocked_or_clear(node, True)
    # /health tells the truth every time, whatever the order of probes and POSTs: RabbitMQ
    # lets a connection's first publish after the alarm through, then blocks it, and the
    # probe's publish used to be such a first one (200 while every POST got 503).
    probes = [health(system) for _ in range(3)]
    seconds = [assert_503_within_bound(system, f"alarm-{n}", f"sku,quantity\nBOUND-B,{n}\n".encode()) for n in (1, 2)]
    for _ in range(5):
        probes.append(health(system))
        time.sleep(0.3)
    assert [(status, reason) for status, reason, _ in probes] == [(503, "broker_blocked")] * 8, probes
    slowest_health = max(s for _, _, s in probes)
    assert slowest_health <= REQUEST_BOUND, f"/health answered after {slowest_health:.1f}s"
    print(f"[bounds] memory alarm: POST 503 after {max(seconds):.2f}s, /health broker_blocked after {slowest_health:.2f}s")
    # The jobs were recorded before their publish: they wait, none is lost.
    records = [system.store().get_job(f"shipment-alarm-{n}") for n in (1, 2)]
    assert all(r is not None and r.state == "waiting" for r in records), records

    node.clear_memory_alarm()
    wait_until_blocked_or_clear(node, False)
    health_says(system, "")
    for n in (1, 2):
        assert system.wait_state(f"shipment-alarm-{n}", timeout=60)["state"] == "completed"
        # The producer's retry of the 503: the same job, nothing imported again.
        status, _, again, _ = post(system, f"alarm-{n}", f"sku,quantity\nBOUND-B,{n}\n".encode())
        assert (status, again["jobId"]) == (202, f"shipment-alarm-{n}"), again
    assert system.store().stock_of(["BOUND-A", "BOUND-B"]) == {"BOUND-A": 1, "BOUND-B": 3}
    assert system.store().generation() == 3


def test_silent_broker_503_within_the_bound(node: RabbitNode, system: System) -> None:
    """SIGSTOP: connections stay open and nothing answers; the confirm wait ends at the bound."""
    status, _, accepted, _ = post(system, "before-pause", b"sku,quantity\nBOUND-C,2\n")
    assert status == 202, accepted
    node.pause()
    try:
        seconds = assert_503_within_bound(system, "paused-1", b"sku,quantity\nBOUND-D,4\n")
        slowest_health = health_says(system, "broker_unreachable")
        assert slowest_health <= REQUEST_BOUND, f"/health answered after {slowest_health:.1f}s"
        print(f"[bounds] silent broker: POST 503 after {seconds:.2f}s, /health broker_unreachable after {slowest_health:.2f}s")
    finally:
        node.resume()
    health_says(system, "")
    assert system.wait_state("shipment-paused-1", timeout=60)["state"] == "completed"
    assert system.store().stock_of(["BOUND-C", "BOUND-D"]) == {"BOUND-C": 2, "BOUND-D": 4}


def test_dead_broker_503_at_once_and_health_says_unreachable(node: RabbitNode, system: System) -> None:
    node.kill()
    seconds = assert_503_within_bound(system, "dead-1", b"sku,quantity\nBOUND-E,5\n")
    slowest_health = health_says(system, "broker_unreachable")
    print(f"[bounds] dead broker: POST 503 after {seconds:.2f}s, /health broker_unreachable after {slowest_health:.2f}s")
    node.start()
    health_says(system, "")
    assert system.wait_state("shipment-dead-1", timeout=60)["state"] == "completed"
    status, _, accepted, _ = post(system, "after-restart", b"sku,quantity\nBOUND-E,1\n")
    assert status == 202, accepted
    assert system.wait_state("shipment-after-restart", timeout=60)["state"] == "completed"
    assert system.store().stock_of(["BOUND-E"]) == {"BOUND-E": 6}


def test_the_pika_internals_the_publish_deadline_uses_hold(node: RabbitNode) -> None:
    """BoundedRabbitmqBroker's deadline timer (pika's private connection API) on
    a real node: a publish to a silent broker raises ConnectionClosed at the bound."""
    broker = BoundedRabbitmqBroker(url=node.url, bound_s=1.0, middleware=[])
    message = dramatiq.Message(queue_name="bounds-probe", actor_name="a", args=(), kwargs={}, options={})
    try:
        broker.enqueue(message)  # declares the queue; confirmed
        assert broker.sickness() == ""
        node.pause()
        try:
            started = time.monotonic()
            with pytest.raises(dramatiq.errors.ConnectionClosed):
                broker.enqueue(message)
            assert time.monotonic() - started <= 1.5
            started = time.monotonic()
            assert broker.sickness() == "broker_unreachable"
            assert time.monotonic() - started <= 1.5
        finally:
            node.resume()
        wait_for(lambda: broker.sickness() == "", 20, 0.5, message="the probe confirmed again")
        broker.enqueue(message)
    finally:
        broker.close()
