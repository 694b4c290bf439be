"""Real processes for integration tests: `importer worker`, `importer serve`,
and an HTTP client speaking to them. No mocks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from importer.domain.locations import MAIN
from importer.adapters.bootstrap import clock_ms, redis_client
from importer.adapters.dramatiq.broker import build_broker
from importer.adapters.dramatiq.producer import ImportQueue
from importer.adapters.redis.store import RedisStore
from importer.adapters.settings import Settings
from importer.handlers.auth import hash_key, new_key

ROOT = Path(__file__).resolve().parents[2]
RABBITMQ_URL = os.environ.get("IMPORTER_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
FIXTURES = ROOT / "fixtures"


class ProbeStore(RedisStore):
    """The product's store plus reads and a removal only tests need."""

    def stock_of(self, skus: list[str], location: str = MAIN) -> dict[str, int]:
        values = self.client.hmget(self.partition(location).stock, skus) if skus else []
        return {sku: int(v) if v is not None else 0 for sku, v in zip(skus, values)}

    def generation(self, location: str = MAIN) -> int:
        return int(self.client.get(self.partition(location).generation) or 0)

    def delete_job_record(self, job_id: str) -> None:
        """Remove a job record as retention would."""
        k = self.keys
        record = self.client.hmget(k.job(job_id), "uploadId", "owner")
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(k.job(job_id), k.job_events(job_id), k.rejections(job_id))
        if record[0]:
            pipe.delete(k.upload(record[0].decode()))
        indexes = [k.completed, k.failed, k.waiting, k.unsent, k.active, k.deadline, k.finished_new]
        if record[1] is not None:
            owner = record[1].decode()
            indexes += [k.owner_jobs(owner), k.completed_of(owner), k.failed_of(owner)]
        for index in indexes:
            pipe.zrem(index, job_id)
        pipe.execute()


def server_folder(name: str) -> Path:
    """A new folder for a test's embedded PostgreSQL data. As root the server runs as
    'nobody', which must enter every parent folder: the project's test-artifacts/
    when it can, else a new folder under the system's temp folder (a clone inside
    a 0700 folder, as `mktemp -d` makes). Removed by the caller."""
    import tempfile

    folder = ROOT / "test-artifacts" / f"{name}-{uuid.uuid4().hex[:10]}"
    if os.geteuid() != 0 or all(parent.stat().st_mode & 0o001 for parent in ROOT.parents):
        folder.mkdir(parents=True)
        return folder
    folder = Path(tempfile.mkdtemp(prefix=f"importer-{name}-"))
    folder.chmod(0o755)
    return folder


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: Any, timeout: float, interval: float = 0.05, message: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: int) -> None:
        os.killpg(self.popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole process group, as a machine dying would."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(timeout=10)

    def stop(self, timeout: float = 30) -> int:
        self.terminate()
        return self.wait_stopped(timeout)

    def terminate(self) -> None:
        """SIGTERM: a graceful stop begins (:meth:`wait_stopped` waits for it)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float = 30) -> int:
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        return self.popen.returncode


@dataclass(frozen=True)
class MonitorLine:
    time: float  # the server's time of running the command
    client: str  # address:port of the connection that sent it
    command: str


class Monitor:
    """MONITOR's lines that contain ``marker``, from a thread, until :meth:`stop`,
    which returns every such line the server ran before it was called."""

    def __init__(self, url: str, marker: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.lines: list[MonitorLine] = []
        self._token = uuid.uuid4().hex
        self._read = 0
        ready = threading.Event()

        def run() -> None:
            with self.client.monitor() as m:
                ready.set()
                for cmd in m.listen():
                    if self._token in cmd["command"]:
                        break  # stop()'s own marker: every command before it has been seen
                    if marker in cmd["command"]:
                        address = f"{cmd.get('client_address')}:{cmd.get('client_port')}"
                        self.lines.append(MonitorLine(float(cmd["time"]), address, cmd["command"]))

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        assert ready.wait(10)

    def unread(self) -> list[MonitorLine]:
        """The lines caught since the last call (from the start on the first)."""
        lines = self.lines[self._read:]
        self._read += len(lines)
        return lines

    def stop(self) -> list[MonitorLine]:
        try:
            self.client.echo(self._token)
        finally:
            self._thread.join(10)
            self.client.close()
        return self.lines


class Headers(dict[str, str]):
    """Response headers, looked up case-insensitively as HTTP says (granian
    sends them lower-cased, gunicorn and waitress as the app wrote them)."""

    def __init__(self, items: Any) -> None:
        super().__init__((k.lower(), v) for k, v in items)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key.lower() if isinstance(key, str) else key)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key.lower(), default)


#: The stock locations every test system declares (IMPORTER_LOCATIONS); any other is refused.
TEST_LOCATIONS = "paris,lyon,berlin,berlin-2,rome,oslo"


@dataclass
class System:
    """One isolated Importer installation (own key prefix) on the shared Redis."""

    redis_url: str
    workdir: Path
    env_overrides: dict[str, str] = field(default_factory=dict)
    prefix: str = field(default_factory=lambda: "{t" + uuid.uuid4().hex[:12] + "}:")
    api_key: str = field(default_factory=new_key)
    other_key: str = field(default_factory=new_key)  # owner-b
    procs: list[Proc] = field(default_factory=list)
    base_url: str = ""
    #: "redis" (the store's Redis carries the messages) or "rabbitmq".
    transport: str = "redis"
    queue_name: str = field(default_factory=lambda: "imports-" + uuid.uuid4().hex[:10])
    brokers: list[Any] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("IMPORTER_")}
        env.update(
            IMPORTER_REDIS_URL=self.redis_url,
            IMPORTER_KEY_PREFIX=self.prefix,
            IMPORTER_API_KEYS=f"owner-a:{hash_key(self.api_key)},owner-b:{hash_key(self.other_key)}",
            IMPORTER_HEARTBEAT_TIMEOUT="3",
            IMPORTER_ATTEMPT_LEASE="3",
            IMPORTER_BROKER_MAINTENANCE_CHANCE="1000000",
            IMPORTER_RECONCILE_INTERVAL="0.5",
            # No load balancer to drain from: `importer serve` stops at once on SIGTERM
            # (the tests of the drain set it).
            IMPORTER_HTTP_DRAIN_DELAY="0",
            # The locations the tests use, declared by `importer serve` and `worker` at start.
            IMPORTER_LOCATIONS=TEST_LOCATIONS,
            PYTHONUNBUFFERED="1",
        )
        env["IMPORTER_QUEUE"] = self.queue_name
        if self.transport == "rabbitmq":
            env["IMPORTER_BROKER_URL"] = RABBITMQ_URL
        env.update(self.env_overrides)
        return env

    @property
    def settings(self) -> Settings:
        return Settings.from_env(self.env)

    def store(self) -> ProbeStore:
        # The product's own client: a RedisCluster when the system runs on one (IMPORTER_REDIS_CLUSTER).
        return ProbeStore(redis_client(self.settings), self.settings, clock_ms=clock_ms)

    def queue(self) -> ImportQueue:
        """The product's producer, for sending messages directly (closed by stop_all)."""
        settings = self.settings
        queue = ImportQueue(build_broker(settings, redis.Redis.from_url(self.redis_url)), settings)
        self.brokers.append(queue.broker)
        return queue

    def _spawn(self, name: str, args: list[str], env: dict[str, str], module: str = "importer.adapters.processes.cli") -> Proc:
        log_path = self.workdir / f"{name}-{len(self.procs)}.log"
        with open(log_path, "wb") as handle:
            popen = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                env=env, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
            )
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def start_worker(self, *, threads: int = 4, prefetch: int = 0, **env: str) -> Proc:
        """One worker process; prefetch 0 = dramatiq's 2 x threads (small, so that
        tests with two workers see both of them take messages)."""
        args = ["worker", "--processes", "1", "--threads", str(threads), "--prefetch", str(prefetch)]
        proc = self._spawn("worker", args, {**self.env, **env})
        wait_for(lambda: "ready for action" in proc.log() or proc.popen.poll() is not None, 30, message="worker boot")
        assert proc.popen.poll() is None, proc.log()
        return proc

    def start_ledger(self, *, once: bool = False, **env: str) -> Proc:
        """`importer ledger` (the exporter); needs IMPORTER_DATABASE_URL in the system's env."""
        assert "IMPORTER_DATABASE_URL" in self.env, "make_system(IMPORTER_DATABASE_URL=...) first"
        proc = self._spawn("ledger", ["ledger", *(["--once"] if once else [])], {**self.env, **env})
        if not once:
            wait_for(lambda: "ledger.ready" in proc.log() or proc.popen.poll() is not None, 30, message="ledger boot")
            assert proc.popen.poll() is None, proc.log()
        return proc

    def start_http(
        self, *, workers: int = 1, server: str = "granian", sick: str = "", threads: int | None = None, **env: str
    ) -> Proc:
        """`importer serve` (granian, or `--server gunicorn`), or the same app under waitress.
        Ready when /health answers 200, or with ``sick`` when it answers 503 with that
        reason (a dependency made sick on purpose, e.g. ``broker_unreachable``)."""
        port = free_port()
        if server == "waitress":
            proc = self._spawn(
                "http", [f"--listen=127.0.0.1:{port}", "--call", "importer.adapters.processes.wsgi_app:wsgi_app"],
                {**self.env, **env}, module="waitress",
            )
        else:
            argv = ["serve", "--server", server, "--bind", f"127.0.0.1:{port}", "--workers", str(workers)]
            if threads is not None:
                argv += ["--threads", str(threads)]
            proc = self._spawn("http", argv, {**self.env, **env})
        self.base_url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            if proc.popen.poll() is not None:
                raise AssertionError(proc.log())
            try:
                status, _, body = self.request("GET", "/health")
            except OSError:
                return False
            if sick and status == 503:
                return bool(json.loads(body).get("reason") == sick)
            return status == 200

        wait_for(healthy, 30, 0.1, message="HTTP health")
        return proc

    def stop_all(self) -> None:
        # Every process stops at once (each graceful stop takes its own seconds: one after the other they added up).
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            proc.wait_stopped()
        for broker in self.brokers:
            broker.close()
            client = getattr(broker, "client", None)
            if client is not None:
                client.close()

    # -- HTTP -----------------------------------------------------------

    def request(
        self, method: str, path: str, *, body: bytes | None = None, ctype: str = "", key: str | None = "default",
        base_url: str | None = None, headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request((base_url or self.base_url) + path, data=body, method=method, headers=headers or {})
        if key == "default":
            key = self.api_key
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        if ctype:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, Headers(resp.headers.items()), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, Headers(err.headers.items()), err.read()

    def post_csv(self, batch_id: str, data: bytes, **kw: Any) -> tuple[int, Any]:
        status, _, body = self.request("POST", f"/api/imports?batchId={batch_id}", body=data, ctype="text/csv", **kw)
        return status, json.loads(body)

    def get_job(self, job_id: str, **kw: Any) -> tuple[int, Any]:
        status, _, body = self.request("GET", f"/api/imports/{job_id}", **kw)
        return status, json.loads(body)

    def wait_state(
        self, job_id: str, states: tuple[str, ...] = ("completed", "failed"), timeout: float = 30, key: str = "default",
    ) -> Any:
        def done() -> Any:
            status, record = self.get_job(job_id, key=key)
            return record if status == 200 and record["state"] in states else None

        return wait_for(done, timeout, 0.05, message=f"{job_id} in {states}")


def queued_messages(system: System) -> int:
    """Messages in the queue that no worker holds: ready to be delivered."""
    if system.transport == "rabbitmq":
        import pika

        connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
        try:
            declared = connection.channel().queue_declare(system.queue_name, passive=True)
            return int(declared.method.message_count)
        except pika.exceptions.ChannelClosedByBroker:
            return 0  # never declared: nothing was ever sent
        finally:
            if connection.is_open:
                connection.close()
    client = redis.Redis.from_url(system.redis_url)
    return int(client.llen(f"{system.prefix}dramatiq:{system.queue_name}"))


def stored_messages(system: System) -> int | None:
    """Messages stored by the broker, delivered-but-unacknowledged included (Redis broker only)."""
    if system.transport != "redis":
        return None
    client = redis.Redis.from_url(system.redis_url)
    return int(client.hlen(f"{system.prefix}dramatiq:{system.queue_name}.msgs"))


def delete_rabbitmq_queues(system: System) -> None:
    if system.transport != "rabbitmq":
        return
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        channel = connection.channel()
        for suffix in ("", ".DQ", ".XQ"):
            channel.queue_delete(system.queue_name + suffix)
    finally:
        connection.close()


def rabbitmq_available() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=2):
            return True
    except OSError:
        return False
