"""The bench's shared state: its configuration, its own valkey, and how it starts the HTTP servers and workers."""

from __future__ import annotations

import http.client
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import redis
from importer.adapters.redis.embedded import EmbeddedRedis
from importer.handlers.auth import hash_key, new_key

from bench.suite.common import BIN, OWNER, ROOT, BenchError, children, free_port, log, tail
from bench.suite.procs import Proc, Procs
from bench.suite.report import Results

if TYPE_CHECKING:
    from bench.suite.peers.bullmq_runner import BullmqPeer


@dataclass
class Config:
    repeat: int
    quick: bool
    drain_ns: list[int]
    processes: int
    threads: int
    prefetch: int
    http_workers: int
    http_threads: int
    duration: int
    rows: int
    accounting_n: int
    only: set[str]
    peer: bool = True
    peer_concurrency: int = 16
    http_server: str = "granian"


class Bench:
    def __init__(self, cfg: Config, tmp: Path) -> None:
        self.cfg = cfg
        self.tmp = tmp
        self.procs = Procs(tmp)
        self.results = Results()
        self.server: EmbeddedRedis | None = None
        self.url = ""
        self.client: redis.Redis | None = None
        self.api_key = new_key()
        self.valkey_version = "?"
        self.server_pid = 0
        self.server_config = "?"
        self.wrk: str | None = None
        self.wrk_note = ""
        self.other_load: list[float] = []
        self.peer: BullmqPeer | None = None  # set when Node.js and `npm ci` are there
        self.peer_note = ""
        self.load_start = "?"
        self.code_start = "?"
        self.accounting: dict[str, dict] = {}  # type: ignore[type-arg]  # subject -> MONITOR counts
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(("IMPORTER_", "dramatiq_", "BENCH_", "PEER_"))}
        base_env["PYTHONUNBUFFERED"] = "1"
        self.base_env = base_env
        self.max_rows_env = os.environ.get("IMPORTER_MAX_ROWS", "")
    # -- server -----------------------------------------------------------------

    def start_server(self) -> None:
        port = free_port()
        self.server = EmbeddedRedis(self.tmp / "valkey", port=port)
        self.url = self.server.start()
        if not self.url.startswith("redis://127.0.0.1:") or self.url.endswith(":6379"):
            raise BenchError(f"refusing to run on {self.url}")
        self.client = redis.Redis.from_url(self.url, socket_timeout=60)
        info = self.client.info("server")
        self.valkey_version = str(info.get("valkey_version") or info.get("redis_version"))
        self.server_pid = int(info["process_id"])
        cfg = {k: self.client.config_get(k).get(k) for k in ("appendonly", "appendfsync", "maxmemory-policy", "save")}
        self.server_config = ", ".join(f"{k} {v!r}" for k, v in cfg.items())
        log(f"own server: valkey {self.valkey_version} at {self.url} ({self.server_config})")

    def stop_server(self) -> None:
        if self.client is not None:
            try:
                self.client.close()
            except Exception:
                pass
        if self.server is not None:
            try:
                self.server.stop()
            except Exception as exc:  # never hide the results because of this
                log(f"stopping the server: {exc!r}")

    def flush(self) -> None:
        """Empty the server, and compact its AOF (BGREWRITEAOF, waited for): the
        next run starts from the same small AOF whoever ran before, and pays the
        automatic rewrites its own writes bring (valkey's auto-aof-rewrite), not
        the growth an earlier run left."""
        assert self.client is not None
        self.client.flushall()
        if self.client.config_get("appendonly").get("appendonly") != "yes":
            return
        deadline = time.monotonic() + 60
        while self.client.info("persistence").get("aof_rewrite_in_progress") and time.monotonic() < deadline:
            time.sleep(0.05)
        self.client.bgrewriteaof()
        time.sleep(0.05)
        while time.monotonic() < deadline:
            info = self.client.info("persistence")
            if not info.get("aof_rewrite_in_progress") and not info.get("aof_rewrite_scheduled"):
                break
            time.sleep(0.05)

    # -- env --------------------------------------------------------------------

    def importer_env(self, prefix: str) -> dict[str, str]:
        env = dict(self.base_env)
        env.update(
            IMPORTER_REDIS_URL=self.url,
            IMPORTER_KEY_PREFIX=prefix,
            IMPORTER_RATE_LIMIT="0",
            IMPORTER_API_KEYS=f"{OWNER}:{hash_key(self.api_key)}",
            # Retention must not remove records before the count reaches N.
            IMPORTER_KEEP_COMPLETED_COUNT="10000000",
            IMPORTER_KEEP_COMPLETED_AGE="10000000",
            # Only shortens `importer serve`'s shutdown; no effect while it serves.
            IMPORTER_HTTP_DRAIN_DELAY="0",
        )
        if self.max_rows_env:
            env["IMPORTER_MAX_ROWS"] = self.max_rows_env
        return env

    def importer_argv(self, *args: str) -> list[str]:
        exe = BIN / "importer"
        if exe.exists():
            return [str(exe), *args]
        return [sys.executable, "-m", "importer.adapters.processes.cli", *args]

    def worker_args(self) -> list[str]:
        c = self.cfg
        return ["--processes", str(c.processes), "--threads", str(c.threads), "--prefetch", str(c.prefetch)]

    # -- stats ------------------------------------------------------------------

    def server_stats(self) -> dict[str, int]:
        assert self.client is not None
        info = self.client.info("all")
        out = {
            "commands": int(info["total_commands_processed"]),
            "reads": int(info.get("total_reads_processed", 0)),
        }
        for key, value in info.items():
            if key.startswith("cmdstat_") and isinstance(value, dict):
                out[key[len("cmdstat_"):]] = int(value.get("calls", 0))
                out["usec:" + key[len("cmdstat_"):]] = int(value.get("usec", 0))
        return out

    def wait_http(self, proc: Proc, port: int, path: str, timeout: float = 60, ok: tuple[int, ...] = (200,)) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise BenchError(f"{proc.name} exited with {proc.popen.returncode}: {tail(proc.log_path, 5)}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", path)
                status = conn.getresponse().status
                conn.close()
                if status in ok:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise BenchError(f"{proc.name} not healthy after {timeout:.0f} s")

    def start_serve(self, env: dict[str, str]) -> tuple[Proc, int]:
        """``importer serve`` with the bench's server, workers and threads (the product's defaults)."""
        port = free_port()
        argv = self.importer_argv(
            "serve", "--bind", f"127.0.0.1:{port}", "--server", self.cfg.http_server,
            "--workers", str(self.cfg.http_workers), "--threads", str(self.cfg.http_threads),
        )
        proc = self.procs.spawn("importer-serve", argv, env)
        self.wait_http(proc, port, "/health")
        return proc, port

    def start_bare(self) -> tuple[Proc, int]:
        """bench/suite/bare_app.py under the same server, workers and threads as ``importer serve``."""
        port = free_port()
        c = self.cfg
        if c.http_server == "granian":
            argv = [
                str(BIN / "granian"), "--interface", "wsgi", "--host", "127.0.0.1", "--port", str(port),
                "--workers", str(c.http_workers), "--blocking-threads", str(c.http_threads),
                "--log-level", "warning", "--working-dir", str(ROOT), "bench.suite.bare_app:app",
            ]
        else:
            argv = [
                str(BIN / "gunicorn"), "bench.suite.bare_app:app", "--bind", f"127.0.0.1:{port}",
                "--workers", str(c.http_workers), "--threads", str(c.http_threads),
                "--worker-class", "gthread" if c.http_threads > 1 else "sync",
                "--timeout", "30", "--graceful-timeout", "30", "--log-level", "warning", "--chdir", str(ROOT),
            ]
        proc = self.procs.spawn(f"bare-{c.http_server}", argv, dict(self.base_env))
        self.wait_http(proc, port, "/", ok=(202,))
        return proc, port

    def start_floor(self, model: str = "wsgi") -> tuple[Proc, int]:
        """bench/suite/model_apps.py under granian with ``importer serve``'s processes: the same minimal
        POST (read the body, one EVALSHA shaped like enqueue.lua's writes, 202) and no Importer code.
        ``wsgi``: blocking threads, as ``importer serve``; ``wsgi-grouped``: the same with group
        commit of the threads' calls (model_apps.GroupCommit); ``rsgi``: one asyncio loop per process."""
        port = free_port()
        c = self.cfg
        argv = [
            str(BIN / "granian"), "--interface", model, "--host", "127.0.0.1", "--port", str(port),
            "--workers", str(c.http_workers), "--log-level", "warning", "--working-dir", str(ROOT),
        ]
        if model in ("wsgi", "wsgi-grouped"):
            app = "wsgi_app" if model == "wsgi" else "wsgi_grouped_app"
            argv[2] = "wsgi"
            argv += ["--blocking-threads", str(c.http_threads), f"bench.suite.model_apps:{app}"]
        else:
            argv += ["bench.suite.model_apps:rsgi_app"]
        proc = self.procs.spawn(f"floor-{model}", argv, dict(self.base_env, BENCH_REDIS_URL=self.url))
        self.wait_http(proc, port, "/", ok=(202,))
        return proc, port

    def post(self, port: int, path: str, body: bytes, key: str | None) -> tuple[int, bytes, float]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        headers = {"Content-Type": "text/csv", "Content-Length": str(len(body))}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        t = time.monotonic()
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        elapsed = time.monotonic() - t
        conn.close()
        return resp.status, data, elapsed

    def wait_worker_ready(self, proc: Proc, namespace: str, timeout: float = 60) -> None:
        assert self.client is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise BenchError(f"worker exited with {proc.popen.returncode}: {tail(proc.log_path, 5)}")
            kids = children(proc.popen.pid)
            if len(kids) >= self.cfg.processes and self.client.zcard(f"{namespace}:__heartbeats__") >= self.cfg.processes:
                return
            time.sleep(0.1)
        raise BenchError("worker not ready")

