"""Quick fault scenarios (`make test` runs them; `pytest -m faults` alone).

Each one: an own redis-server, two real `importer worker` processes, one
`importer serve`, a POST driver, a real fault (signals, CLIENT PAUSE, CONFIG SET
maxmemory), then the invariant checker (tests/faults/harness.py).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis

from importer.adapters.redis.records import stream_events
from tests.faults.harness import (
    FAULT_ENV, Driver, all_stopped, check_invariants, children_of, csv_for, documented_bound, preload_scripts, script_sha,
    tcp_ports_of,
)
from tests.integration.support import Monitor, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.integration]

BOUND = documented_bound(FAULT_ENV) + 10  # + 10 s: the machine is shared and loaded
SOCKET_TIMEOUT = float(FAULT_ENV["IMPORTER_REDIS_SOCKET_TIMEOUT"])
#: "no request waits longer than the socket timeout + 1 s", + 1 s for a loaded machine.
REQUEST_BOUND = SOCKET_TIMEOUT + 2


#: Slows each attempt of the worker that a scenario stops or kills, so that it
#: surely holds running attempts and prefetched messages at that moment.
SLOW = "before_apply:0.3"


def _start(make_redis: Any, make_faulty: Any, *, fsync: str = "always", workers: int = 2, slow_first: bool = False,
           **env: str) -> tuple[Any, Any]:
    server = make_redis(fsync)
    system = make_faulty(server, **env)
    for n in range(workers):
        system.start_worker(**({"IMPORTER_FAULT": SLOW} if slow_first and n == 0 else {}))
    # 2 x 4 threads: more than the driver's 4 + the health probe's 1 concurrent
    # requests, so a request's time is its own wait, not a queue behind others.
    system.start_http(workers=2)
    return server, system


class HealthProbe:
    """GET /health every 0.2 s from a thread; keeps (status, reason, seconds)."""

    def __init__(self, system: Any) -> None:
        self.system = system
        self.seen: list[tuple[int, str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                status, _, body = self.system.request("GET", "/health", key=None)
                reason = json.loads(body).get("reason", "")
            except OSError:
                status, reason = 0, "no answer"
            self.seen.append((status, reason, time.monotonic() - started))
            self._stop.wait(0.2)

    def __enter__(self) -> "HealthProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(30)

    def max_seconds(self) -> float:
        return max((s for _, _, s in self.seen), default=0.0)


@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_redis_sigkill_mid_drain_then_restart_on_aof(make_redis: Any, make_faulty: Any, fsync: str) -> None:
    server, system = _start(make_redis, make_faulty, fsync=fsync, slow_first=True)
    driver = Driver(system, 300, seed=1).start()
    driver.posted.wait(60)
    killed_at = time.monotonic()
    server.kill()
    time.sleep(1.0)
    server.restart()
    fault_over = time.monotonic()
    driver.join()
    # appendfsync everysec may lose the last second of acknowledged writes (README, Guarantees).
    # The window ends at the restart, not the kill: a POST in flight at the kill may have been
    # written to the killed server and its 202 read by the driver just after `killed_at`.
    lost_ok = None if fsync == "always" else {
        p.batch_id for p in driver.accepted() if p.accepted_at is not None and killed_at - 2.5 <= p.accepted_at <= fault_over
    }
    check_invariants(system, server.url, driver, fault_over=fault_over, bound=BOUND, lost_ok=lost_ok)


def test_redis_sigstop_mid_drain(make_redis: Any, make_faulty: Any) -> None:
    server, system = _start(make_redis, make_faulty, slow_first=True)
    driver = Driver(system, 300, seed=2).start()
    driver.posted.wait(60)
    with HealthProbe(system) as health:
        server.sigstop()
        time.sleep(SOCKET_TIMEOUT * 2)
        server.sigcont()
        fault_over = time.monotonic()
        driver.join()
    report = check_invariants(system, server.url, driver, fault_over=fault_over, bound=BOUND)
    assert 503 in report.statuses, "no POST met the stopped Redis: the scenario tested nothing"
    assert report.max_request_s <= REQUEST_BOUND, f"a POST waited {report.max_request_s:.1f}s"
    assert health.max_seconds() <= REQUEST_BOUND, f"/health waited {health.max_seconds():.1f}s"
    assert any(s == 503 for s, _, _ in health.seen), "/health never said 503 while Redis was stopped"


def test_redis_full_then_freed(make_redis: Any, make_faulty: Any) -> None:
    server, system = _start(make_redis, make_faulty, slow_first=True)
    admin = server.client()
    driver = Driver(system, 300, seed=3).start()
    driver.posted.wait(60)
    with HealthProbe(system) as health:
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory", used + 200_000)
        wait_for(lambda: 503 in driver.statuses(), 30, 0.1, message="a POST refused by the full Redis")
        # Full, Redis refuses writes only while over the limit, and the workers free memory as
        # they drain: the fault lasts until a probe met it (CI once saw 10 probes land in between).
        time.sleep(2)
        wait_for(lambda: any(r == "redis_refuses_writes" for _, r, _ in health.seen), 20, 0.1,
                 message="/health saying redis_refuses_writes while Redis is full")
        admin.config_set("maxmemory", 0)
        fault_over = time.monotonic()
        driver.join()
    report = check_invariants(system, server.url, driver, fault_over=fault_over, bound=BOUND)
    assert 503 in report.statuses
    reasons = {r for s, r, _ in health.seen if s == 503}
    assert "redis_refuses_writes" in reasons, f"/health while Redis was full: {sorted(set(health.seen))[:5]}"


def _busy_slow_worker(make_redis: Any, make_faulty: Any, seed: int) -> tuple[Any, Any, Any, Any]:
    """A slowed worker alone until it runs attempts with a backlog behind it,
    then a second worker: the first one surely holds running attempts and
    prefetched messages when the scenario stops or kills it."""
    server, system = _start(make_redis, make_faulty, workers=1, slow_first=True)
    slow = system.procs[0]
    driver = Driver(system, 300, seed=seed).start()
    wait_for(lambda: slow.log().count("fault.injected") >= 4, 60, 0.05, message="the slow worker running attempts")
    system.start_worker()
    driver.posted.wait(60)
    return server, system, slow, driver


def test_worker_sigstop_past_heartbeat_timeout(make_redis: Any, make_faulty: Any) -> None:
    server, system, stopped, driver = _busy_slow_worker(make_redis, make_faulty, seed=4)
    stopped.signal(signal.SIGSTOP)
    fault_over = time.monotonic()  # the other worker must finish everything while this one sleeps
    try:
        driver.join()
        report = check_invariants(system, server.url, driver, fault_over=fault_over, bound=BOUND)
        assert report.retried >= 1, "the stopped worker held no running attempt: the scenario tested nothing"
    finally:
        stopped.signal(signal.SIGCONT)
    time.sleep(3)  # the stale worker wakes up: nothing it does may change the books
    check_invariants(system, server.url, driver, fault_over=time.monotonic(), bound=BOUND)


def test_worker_sigkill_mid_drain(make_redis: Any, make_faulty: Any) -> None:
    server, system, killed, driver = _busy_slow_worker(make_redis, make_faulty, seed=5)
    killed.kill()
    fault_over = time.monotonic()
    driver.join()
    report = check_invariants(system, server.url, driver, fault_over=fault_over, bound=BOUND)
    assert report.retried >= 1, "the killed worker held no running attempt: the scenario tested nothing"


def test_client_pause_during_posts(make_redis: Any, make_faulty: Any) -> None:
    server, system = _start(make_redis, make_faulty)
    admin = server.client()
    driver = Driver(system, 200, seed=6).start()
    driver.posted.wait(60)
    admin.execute_command("CLIENT", "PAUSE", int((SOCKET_TIMEOUT + 2) * 1000), "ALL")
    time.sleep(SOCKET_TIMEOUT + 2)
    fault_over = time.monotonic()
    driver.join()
    report = check_invariants(system, server.url, driver, fault_over=fault_over, bound=BOUND)
    assert 503 in report.statuses, "no POST met the paused Redis: the scenario tested nothing"
    assert report.max_request_s <= REQUEST_BOUND, f"a POST waited {report.max_request_s:.1f}s"
    retried = [p for p in driver.posts if 503 in p.statuses and p.accepted_at is not None]
    assert retried, "no POST was retried after a 503"



def test_http_sigkill_during_posts(make_redis: Any, make_faulty: Any) -> None:
    """`importer serve` SIGKILLed while POSTs are in flight (8 driver threads
    post back to back, so the kill lands before, inside and after enqueue.lua's
    one atomic call: a record with its message, or nothing), then started
    again. A POST the kill cut off is retried by its client with the same
    batchId: every import is applied once, every 202 is final."""
    server, system = _start(make_redis, make_faulty)
    driver = Driver(system, 300, threads=8, seed=7).start()
    driver.posted.wait(60)
    http = next(p for p in system.procs if p.name == "http")
    http.kill()
    system.start_http(workers=2)
    fault_over = time.monotonic()
    driver.join()
    report = check_invariants(system, server.url, driver, fault_over=fault_over, bound=BOUND)
    assert 0 in report.statuses, "no POST met the killed HTTP process: the scenario tested nothing"

# -- fencing: a stale attempt wakes up --------------------------------------


def _events(client: redis.Redis, prefix: str, job_id: str) -> list[tuple[str, int]]:
    out = []
    for entry_id, fields in client.xrange(f"{prefix}events"):
        if fields[b"jobId"].decode() == job_id:
            out += [(event["event"], event["attempt"]) for event in stream_events(entry_id.decode(), fields)]
    return out


def _attempt_active(client: redis.Redis, prefix: str, job_id: str, attempt: int) -> bool:
    state, current = client.hmget(f"{prefix}job:{job_id}", "state", "attempt")
    return state == b"active" and int(current or 0) == attempt


@pytest.mark.parametrize("time_limit", ["5", "30"], ids=["time_limit_expires_in_stale", "no_time_limit_in_stale"])
def test_stale_attempt_resumed_while_next_attempt_runs(make_redis: Any, make_faulty: Any, time_limit: str) -> None:
    """Attempt 1 (worker A) is SIGSTOPped mid-attempt; attempt 2 starts on worker B
    and is held there by SIGSTOP; A wakes: none of its writes may land, and no
    third attempt starts while the second runs. Then B finishes the job."""
    server = make_redis()
    system = make_faulty(server, IMPORTER_TIME_LIMIT=time_limit)
    client = server.client()
    worker_a = system.start_worker(threads=1, IMPORTER_FAULT="before_apply:2")
    system.start_http()
    rows = {"SKU-1": 5, "SKU-2": 7}
    status, body = system.post_csv("fence-1", csv_for(rows))
    assert status == 202, body
    job_id = body["jobId"]
    wait_for(lambda: _attempt_active(client, system.prefix, job_id, 1), 30, 0.01, message="attempt 1 active")
    worker_a.signal(signal.SIGSTOP)
    try:
        worker_b = system.start_worker(threads=1, IMPORTER_FAULT="before_apply:2")
        wait_for(lambda: _attempt_active(client, system.prefix, job_id, 2), 60, 0.01, message="attempt 2 active")
        worker_b.signal(signal.SIGSTOP)
        seen_before = _events(client, system.prefix, job_id)
        worker_a.signal(signal.SIGCONT)
        time.sleep(2.5)  # attempt 1 wakes: sleep over, it tries progress, apply or a failure write
        record = {k.decode(): v.decode() for k, v in client.hgetall(f"{system.prefix}job:{job_id}").items()}
        after = _events(client, system.prefix, job_id)[len(seen_before):]
        assert record["state"] == "active" and record["attempt"] == "2", record
        assert not [e for e in after if e[1] != 2], f"stale attempt wrote after attempt 2 started: {after}"
        assert not client.exists(f"{system.prefix}done:fence-1"), "stale attempt applied the batch"
    finally:
        worker_a.signal(signal.SIGCONT)
        for proc in system.procs:
            proc.signal(signal.SIGCONT)
    final = system.wait_state(job_id, timeout=60)
    assert final["state"] == "completed" and final["attempt"] == 2, final
    events = _events(client, system.prefix, job_id)
    assert [a for e, a in events if e == "active"] == [1, 2], f"a third attempt started: {events}"
    assert client.hgetall(f"{system.prefix}stock") == {b"SKU-1": b"5", b"SKU-2": b"7"}
    assert int(client.get(f"{system.prefix}generation") or 0) == 1


def test_stale_attempt_resumed_after_retry_finished(make_redis: Any, make_faulty: Any) -> None:
    server = make_redis()
    system = make_faulty(server)
    client = server.client()
    worker_a = system.start_worker(threads=1, IMPORTER_FAULT="before_apply:2")
    system.start_http()
    status, body = system.post_csv("fence-2", csv_for({"SKU-9": 3}))
    assert status == 202, body
    job_id = body["jobId"]
    wait_for(lambda: _attempt_active(client, system.prefix, job_id, 1), 30, 0.01, message="attempt 1 active")
    worker_a.signal(signal.SIGSTOP)
    try:
        system.start_worker(threads=1)
        final = system.wait_state(job_id, timeout=60)
        assert final["state"] == "completed" and final["attempt"] == 2, final
        before = _events(client, system.prefix, job_id)
        record_before = client.hgetall(f"{system.prefix}job:{job_id}")
    finally:
        worker_a.signal(signal.SIGCONT)
    time.sleep(3)
    assert _events(client, system.prefix, job_id) == before, "the stale attempt wrote events after the job finished"
    assert client.hgetall(f"{system.prefix}job:{job_id}") == record_before
    assert client.hgetall(f"{system.prefix}stock") == {b"SKU-9": b"3"}


# -- group commit: a worker killed with a batch of imports in flight ------------------


def _imports_per_call(command: str) -> int:
    """How many imports a start_apply.lua call carries (its KEYS: 16 shared, 5 per import), 0 for another command."""
    words = command.split()
    if len(words) > 2 and words[0].upper() == "EVALSHA" and words[1] == script_sha("start_apply"):
        return (int(words[2]) - 16) // 5
    return 0


def test_worker_sigkill_with_a_batch_of_imports_in_flight(make_redis: Any, make_faulty: Any) -> None:
    """A worker drains a backlog, several small imports per script call. Redis
    is SIGSTOPped, so the worker's calls wait in flight (sent, unanswered), and
    the worker is SIGKILLed; then Redis resumes and runs what the dead worker had
    sent. Until one such call carried several imports, again with a new worker
    on the rest of the backlog. Then a live worker and the reconciler finish
    the rest: every import is applied once or not at all, every 202 final."""
    server, system = _start(make_redis, make_faulty, workers=0)
    preload_scripts(server.client())
    driver = Driver(system, 1200, threads=8, seed=8).start()
    driver.join()
    admin = server.client()
    completed = f"{system.prefix}jobs:completed"
    caught: list[int] = []
    for tries in range(1, 9):
        monitor = Monitor(server.url, system.prefix)
        try:
            # 4 imports per call, 64 fetched at a time: the threads spend most of a
            # round in calls of several imports, not waiting for the next fetch.
            worker = system.start_worker(threads=4, prefetch=64, IMPORTER_APPLY_TOGETHER_MAX="4")
            wait_for(
                lambda: any(_imports_per_call(line.command) > 1 for line in monitor.unread()),
                30, 0.001, message="the worker running a call of several imports",
            )
            server.sigstop()
            time.sleep(0.5)  # every worker thread sends its call and waits for the answer
            worker.kill()
            resumed = time.time()
            server.sigcont()
            time.sleep(1.0)  # Redis runs what the dead worker had sent (no worker runs now)
        finally:
            lines = monitor.stop()
        caught = [n for line in lines if line.time >= resumed and (n := _imports_per_call(line.command)) > 1]
        if caught or admin.zcard(completed) > len(driver.posts) - 200:
            break
    assert caught, "no call of several imports was in flight when the worker was killed: the scenario tested nothing"
    print(f"[faults] calls in flight at kill {tries}, run by Redis after it: {caught} imports each")
    system.start_worker()
    fault_over = time.monotonic()
    report = check_invariants(system, server.url, driver, fault_over=fault_over, bound=BOUND)
    assert report.completed == len(driver.accepted()), report


def test_worker_sigkill_mid_drain_with_imports_fetched_together(make_redis: Any, make_faulty: Any) -> None:
    """The other side: a worker SIGKILLed while it drains a backlog several
    imports per call, Redis running on. The calls it had not sent yet die with
    it (its fetched messages stay in its acks sets); another worker and the
    reconciler run them: every import is applied once, every 202 final."""
    server, system = _start(make_redis, make_faulty, workers=0)
    driver = Driver(system, 1200, threads=8, seed=9).start()
    driver.join()
    admin = server.client()
    completed = f"{system.prefix}jobs:completed"
    held = 0
    for _ in range(4):  # until the kill found the worker holding messages (it drains fast)
        before = admin.zcard(completed)
        worker = system.start_worker(threads=4, prefetch=64)
        wait_for(lambda: admin.zcard(completed) >= before + 20, 30, 0.002, message="the worker draining")
        worker.kill()
        held = sum(admin.scard(key) for key in admin.scan_iter(match=f"{system.prefix}dramatiq:__acks__.*"))
        if held or admin.zcard(completed) > len(driver.posts) - 200:
            break
    assert held > 0, "the killed worker held no message: the scenario tested nothing"
    print(f"[faults] messages the killed worker held: {held}")
    system.start_worker()
    fault_over = time.monotonic()
    report = check_invariants(system, server.url, driver, fault_over=fault_over, bound=BOUND)
    assert report.completed == len(driver.accepted()), report


# -- group commit: an HTTP process killed with a batch of POSTs in flight ----------


def _held_pipelines(admin: Any, ports: set[int]) -> dict[int, int]:
    """Connections from ``ports`` whose command CLIENT PAUSE holds back with more
    commands behind it in the same round trip: port -> bytes of those commands."""
    held = {}
    for entry in admin.client_list():
        port = int(str(entry.get("addr", ":0")).rsplit(":", 1)[1])
        if port in ports and "b" in str(entry.get("flags", "")) and int(entry.get("qbuf", 0)) > 0:
            held[port] = int(entry["qbuf"])
    return held


def test_http_sigkill_with_a_batch_of_posts_in_flight(make_redis: Any, make_faulty: Any) -> None:
    """POSTs from 12 driver threads into two HTTP processes, whose threads
    share one round trip for the enqueue calls that meet. The interleaving is
    forced, and checked, not hoped for:

    1. CLIENT PAUSE WRITE holds each process's round trip on its way; the
       other busy threads queue their calls behind it;
    2. the HTTP processes are SIGSTOPped; the server runs the held round trips
       (UNPAUSE) and their answers wait in the stopped processes' sockets; the
       server pauses again;
    3. the HTTP processes resume: each reads its answers, and the calls queued
       behind leave together in one round trip, held by the server. CLIENT
       LIST shows it: a connection held with more commands behind the first
       (until it does, 2 and 3 repeat);
    4. the HTTP processes are SIGSTOPped, the server runs those round trips,
       and the processes are SIGKILLed before they read the answers: their
       POSTs' clients never learn that their imports were recorded.

    A new HTTP process serves the rest. The clients retry their cut POSTs
    with the same batchId: every import is applied once, every 202 final."""
    server, system = _start(make_redis, make_faulty)
    preload_scripts(server.client())
    driver = Driver(system, 1500, threads=12, seed=10).start()
    enqueue = script_sha("enqueue")
    wait_for(lambda: len(driver.accepted()) >= 30, 60, 0.01, message="POSTs answered")
    http = next(p for p in system.procs if p.name == "http")
    pids = [http.popen.pid, *children_of(http.popen.pid)]
    ports = set().union(*(tcp_ports_of(pid) for pid in pids))
    admin = server.client()
    admin.ping()  # connected now: each command below is one command, not a handshake first
    monitor = Monitor(server.url, system.prefix)
    held: dict[int, int] = {}
    try:
        admin.execute_command("CLIENT", "PAUSE", 20000, "WRITE")
        time.sleep(0.3)  # 1
        for _ in range(10):
            http.signal(signal.SIGSTOP)
            wait_for(lambda: all_stopped(pids), 5, 0.005, message="the HTTP processes stopped")
            admin.execute_command("CLIENT", "UNPAUSE")
            time.sleep(0.2)  # 2
            admin.execute_command("CLIENT", "PAUSE", 20000, "WRITE")
            http.signal(signal.SIGCONT)
            time.sleep(0.3)  # 3
            if held := _held_pipelines(admin, ports):
                break
        assert held, "no round trip of several POSTs' calls was held in 10 rounds"
        http.signal(signal.SIGSTOP)
        wait_for(lambda: all_stopped(pids), 5, 0.005, message="the HTTP processes stopped")
        resumed = time.time()
        admin.execute_command("CLIENT", "UNPAUSE")
        time.sleep(0.5)  # 4: the server runs them
        http.kill()
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        lines = monitor.stop()
    system.start_http(workers=2)
    per_connection = Counter(
        int(line.client.rsplit(":", 1)[1]) for line in lines
        if line.time >= resumed and line.command.split()[:2] == ["EVALSHA", enqueue]
    )
    caught = sorted(n for port, n in per_connection.items() if port in held and n > 1)
    assert caught, f"the held round trips ({held}) ran no several enqueue calls: {dict(per_connection)}"
    print(f"[faults] round trips run after their HTTP process stopped for good: {caught} POSTs each")
    fault_over = time.monotonic()
    driver.join()
    report = check_invariants(system, server.url, driver, fault_over=fault_over, bound=BOUND)
    assert 0 in report.statuses, "no POST met the killed HTTP process: the scenario tested nothing"
    assert report.completed == len(driver.accepted()), report
