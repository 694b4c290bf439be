"""The fault suite with the messages on RabbitMQ (IMPORTER_BROKER_URL=amqp://...).

The scenarios that concern a message transport, against a RabbitMQ node of
the module's own (tests/integration/rabbitmq_node.py: own node name, ports,
epmd and data directory; never the machine's RabbitMQ), an own redis-server,
two real `importer worker` processes and `importer serve`, a POST driver
that retries a 503 with the same body, real signals, and the same invariant
checker as tests/faults/test_faults.py (stock exact, nothing lost or applied
twice, every 202 final within the documented bound, no 500), plus: no
message left ready in RabbitMQ.

Without rabbitmq-server the module skips locally and fails in CI (env CI).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults.harness import FAULT_ENV, Driver, check_invariants, documented_bound, wait_rabbitmq_drained
from tests.faults.test_faults import SLOW, HealthProbe
from tests.integration.rabbitmq_node import RabbitNode, wait_until_blocked_or_clear
from tests.integration.rabbitmq_node import module_node, node  # noqa: F401 (fixtures)
from tests.integration.support import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.integration]

BOUND = documented_bound(FAULT_ENV) + 10  # + 10 s: the machine is shared and loaded
SOCKET_TIMEOUT = float(FAULT_ENV["IMPORTER_REDIS_SOCKET_TIMEOUT"])
#: "no request waits longer than the socket timeout + 1 s" (RabbitMQ's waits
#: included), + 1 s for a loaded machine.
REQUEST_BOUND = SOCKET_TIMEOUT + 2
POSTS = 200


def _start(make_redis: Any, make_faulty: Any, node: RabbitNode, *, workers: int = 2, slow: int = 0,
           **http_env: str) -> tuple[Any, Any]:
    """An own Redis, ``workers`` workers (the first ``slow`` of them slowed by SLOW), `importer serve`."""
    server = make_redis()
    system = make_faulty(server, IMPORTER_BROKER_URL=node.url)
    for n in range(workers):
        system.start_worker(**({"IMPORTER_FAULT": SLOW} if n < slow else {}))
    system.start_http(workers=2, **http_env)
    return server, system


def _during(system: Any, seed: int) -> Driver:
    """A second driver, started when the fault begins: its POSTs meet the fault (the
    first one's mostly answered 202 already, their messages are on their way). Two
    threads: with the first driver's 4 and the health probe's 1, fewer concurrent
    requests than `importer serve`'s 2 x 4 threads, so that a request's time is its
    own wait, not a queue behind others (a POST behind one waiting on a stopped
    Redis took 2 x the socket timeout)."""
    return Driver(system, POSTS // 2, threads=2, seed=seed).start()


def _joined(driver: Driver, *later: Driver) -> Driver:
    """The drivers joined, as one for the checker."""
    driver.join()
    for other in later:
        other.join()
        driver.posts.extend(other.posts)
    return driver


def _check(system: Any, server: Any, node: RabbitNode, driver: Driver, fault_over: float) -> Any:
    report = check_invariants(system, server.url, driver, fault_over=fault_over, bound=BOUND)
    wait_rabbitmq_drained(node.url, system.queue_name, BOUND)
    return report


def _running_attempts(proc: Any, at_least: int) -> None:
    wait_for(lambda: proc.log().count("fault.injected") >= at_least, 60, 0.05, message="the slow worker running attempts")


def test_worker_sigkill_storm(make_redis: Any, make_faulty: Any, node: RabbitNode) -> None:
    """Workers SIGKILLed one after another while they run attempts, each replaced by a new one."""
    server, system = _start(make_redis, make_faulty, node, workers=1, slow=1)
    driver = Driver(system, POSTS, seed=101).start()
    victim = system.procs[0]
    _running_attempts(victim, 4)
    for _ in range(3):
        system.start_worker(IMPORTER_FAULT=SLOW)
        _running_attempts(system.procs[-1], 2)
        victim.kill()
        victim = system.procs[-1]
    system.start_worker()  # a worker at full speed to finish the backlog
    fault_over = time.monotonic()
    driver.join()
    report = _check(system, server, node, driver, fault_over)
    assert report.retried >= 1, "no killed worker held a running attempt: the scenario tested nothing"


def test_http_sigkill_during_posts(make_redis: Any, make_faulty: Any, node: RabbitNode) -> None:
    """`importer serve` SIGKILLed mid-POSTs, some of them between the job's record and its
    publish (each POST waits 0.2 s there), then started again: the reconciler sends those."""
    server, system = _start(make_redis, make_faulty, node, slow=1, IMPORTER_FAULT="before_send:0.2")
    driver = Driver(system, POSTS, seed=102).start()
    driver.posted.wait(60)
    admin, unsent_key = server.client(), system.store().keys.unsent
    wait_for(lambda: admin.zcard(unsent_key) >= 2, 30, 0.01, message="POSTs between their record and their publish")
    http = next(p for p in system.procs if p.name == "http")
    http.kill()
    unsent = int(admin.zcard(unsent_key))
    system.start_http(workers=2)
    fault_over = time.monotonic()
    driver.join()
    report = _check(system, server, node, driver, fault_over)
    assert unsent >= 1, "no job was between its record and its publish: the scenario tested nothing"
    assert 0 in report.statuses, "no POST met the killed HTTP process: the scenario tested nothing"


def test_broker_sigkill_then_restart(make_redis: Any, make_faulty: Any, node: RabbitNode) -> None:
    """The RabbitMQ node SIGKILLed mid-drain (messages queued, prefetched, unacknowledged)
    and started again on its data directory while POSTs go on."""
    server, system = _start(make_redis, make_faulty, node, slow=1)
    driver = Driver(system, POSTS, seed=103).start()
    driver.posted.wait(60)
    with HealthProbe(system) as health:
        node.kill()
        late = _during(system, seed=113)
        time.sleep(1.0)
        node.start()
        fault_over = time.monotonic()
        driver = _joined(driver, late)
    report = _check(system, server, node, driver, fault_over)
    assert 503 in report.statuses, "no POST met the dead broker: the scenario tested nothing"
    assert report.max_request_s <= REQUEST_BOUND, f"a POST waited {report.max_request_s:.1f}s"
    assert health.max_seconds() <= REQUEST_BOUND, f"/health waited {health.max_seconds():.1f}s"
    print(f"[faults] /health with the node dead: 503 {sorted({r for s, r, _ in health.seen if s == 503})}, "
          f"slowest {health.max_seconds():.2f}s")
    assert (503, "broker_unreachable") in {(s, r) for s, r, _ in health.seen}, "/health never said broker_unreachable"


def test_broker_closes_all_connections(make_redis: Any, make_faulty: Any, node: RabbitNode) -> None:
    """`rabbitmqctl close_all_connections` twice while POSTs publish (each POST waits
    0.05 s before its publish, so that they go on) and workers hold messages, then
    more POSTs (on a loaded machine one rabbitmqctl call took 8-12 s, longer than
    the POSTs during it): producers and consumers reconnect, no POST waits past the bound."""
    server, system = _start(make_redis, make_faulty, node, slow=1, IMPORTER_FAULT="before_send:0.05")
    driver = Driver(system, POSTS, seed=104).start()
    driver.posted.wait(60)
    late = _during(system, seed=114)
    node.close_all_connections()
    time.sleep(1.0)
    node.close_all_connections()
    after = Driver(system, 20, threads=2, seed=124).start()  # on the connections RabbitMQ closed
    fault_over = time.monotonic()
    driver = _joined(driver, late, after)
    report = _check(system, server, node, driver, fault_over)
    assert report.max_request_s <= REQUEST_BOUND, f"a POST waited {report.max_request_s:.1f}s"
    # RabbitMQ closed connections of both sides under them. The client reads its
    # close frame (CONNECTION_FORCED), or, on a loaded machine, meets the reset first.
    closed = ("CONNECTION_FORCED", "Stream connection lost")
    for name in ("http", "worker"):
        logs = [p.log() for p in system.procs if p.name == name]
        assert any(mark in log for log in logs for mark in closed), f"no {name} connection was closed"


def test_memory_alarm_blocks_publishers_then_clears(make_redis: Any, make_faulty: Any, node: RabbitNode) -> None:
    """A memory alarm (watermark 0) for twice the socket timeout: POSTs answer 503 within the
    bound, /health says broker_blocked; once it clears every recorded job completes."""
    server, system = _start(make_redis, make_faulty, node, slow=1)
    driver = Driver(system, POSTS, seed=105).start()
    driver.posted.wait(60)
    with HealthProbe(system) as health:
        node.raise_memory_alarm()
        wait_until_blocked_or_clear(node, True)
        late = _during(system, seed=115)
        wait_for(lambda: 503 in late.statuses(), 30, 0.1, message="a POST refused by the blocked broker")
        refused_at = len(health.seen)
        time.sleep(SOCKET_TIMEOUT * 2)
        during = health.seen[refused_at:]  # every probe after a refused POST, the alarm still on
        node.clear_memory_alarm()
        wait_until_blocked_or_clear(node, False)
        fault_over = time.monotonic()
        driver = _joined(driver, late)
    report = _check(system, server, node, driver, fault_over)
    assert report.max_request_s <= REQUEST_BOUND, f"a POST waited {report.max_request_s:.1f}s"
    assert health.max_seconds() <= REQUEST_BOUND, f"/health waited {health.max_seconds():.1f}s"
    reasons = {r for s, r, _ in health.seen if s == 503}
    print(f"[faults] /health during the alarm: 503 {sorted(reasons)}, slowest {health.max_seconds():.2f}s")
    assert "broker_blocked" in reasons, f"/health while RabbitMQ blocked publishers: {sorted(set(health.seen))[:5]}"
    assert len(during) >= 5 and {(s, r) for s, r, _ in during} == {(503, "broker_blocked")}, during


def test_redis_sigstop_while_messages_travel_on_rabbitmq(make_redis: Any, make_faulty: Any, node: RabbitNode) -> None:
    server, system = _start(make_redis, make_faulty, node, slow=1)
    driver = Driver(system, POSTS, seed=106).start()
    driver.posted.wait(60)
    with HealthProbe(system) as health:
        server.sigstop()
        late = _during(system, seed=116)
        time.sleep(SOCKET_TIMEOUT * 2)
        server.sigcont()
        fault_over = time.monotonic()
        driver = _joined(driver, late)
    report = _check(system, server, node, driver, fault_over)
    assert 503 in report.statuses, "no POST met the stopped Redis: the scenario tested nothing"
    assert report.max_request_s <= REQUEST_BOUND, f"a POST waited {report.max_request_s:.1f}s"
    assert health.max_seconds() <= REQUEST_BOUND, f"/health waited {health.max_seconds():.1f}s"
    assert (503, "redis_unreachable") in {(s, r) for s, r, _ in health.seen}, "/health never said redis_unreachable"
