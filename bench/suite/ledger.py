"""7. ledger: the ledger on and off in the same run (each round with its own
embedded valkey and, on, its own embedded PostgreSQL; rounds alternate):

* the drain of N pre-enqueued 3-row imports through one `importer worker`
  (2 threads), with `importer ledger` exporting meanwhile (on) or not (off);
  the exporter starts, and is ready, before the timed drain;
* the export lag sampled every 100 ms during that drain (on);
* Redis `used_memory` growth once retention removed the job records and the
  exporter trimmed (hot window and horizon 0 here), per import;
* one 100,000-row shipment: the time one exporter pass takes to commit it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import redis

from bench.suite.common import ROOT, csv_3rows, csv_rows, log
from bench.suite.producer import preenqueue_importer
from bench.suite.report import at_most
from importer.adapters.postgres.embedded import EmbeddedPostgres
from bench.studies.restore import one_round as restore_round
from importer.adapters.redis.embedded import EmbeddedRedis

if TYPE_CHECKING:
    from bench.suite.servers import Bench


def _env(url: str, db: str | None, prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMPORTER_")}
    env.update(
        IMPORTER_REDIS_URL=url, IMPORTER_KEY_PREFIX=prefix, IMPORTER_API_KEYS="bench:" + "0" * 64,
        IMPORTER_RATE_LIMIT="0", IMPORTER_KEEP_COMPLETED_AGE="0", IMPORTER_KEEP_COMPLETED_COUNT="0",
        IMPORTER_RECONCILE_INTERVAL="0.5", IMPORTER_LEDGER_HOT_WINDOW="0", IMPORTER_IDEMPOTENCY_HORIZON="0",
        IMPORTER_LOG_FORMAT="json",
    )
    if db:
        env["IMPORTER_DATABASE_URL"] = db
    return env


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "importer.adapters.processes.cli", *args], env=env, cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_ready(log: Path, seen: int, proc: subprocess.Popen[bytes], limit_s: float = 60) -> None:
    """Until the exporter started at log size ``seen`` has logged ledger.ready."""
    deadline = time.monotonic() + limit_s
    while b"ledger.ready" not in log.read_bytes()[seen:]:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"importer ledger did not start: {log.read_bytes()[seen:][-2000:]!r}")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextmanager
def _servers(work: Path, ledger_on: bool, prefix: str) -> Iterator[tuple[str, str | None, dict[str, str], redis.Redis]]:
    """A round's own valkey (append-only off: memory, not the disk, is measured) and,
    ledger on, its own embedded PostgreSQL: (Redis URL, database URL, env, client)."""
    work.mkdir(parents=True, exist_ok=True)
    valkey = EmbeddedRedis(work / "valkey")
    url = valkey.start()
    pg = EmbeddedPostgres(work / "pg" / "data") if ledger_on else None
    try:
        db = pg.start() if pg else None
        client = redis.Redis.from_url(url)
        client.config_set("appendonly", "no")
        try:
            yield url, db, _env(url, db, prefix), client
        finally:
            client.close()
    finally:
        if pg:
            pg.stop()
        valkey.stop()
        shutil.rmtree(work, ignore_errors=True)


def _wait_completed(client: redis.Redis, prefix: str, n: int, limit_s: float = 900) -> None:
    started = time.monotonic()
    while int(client.hget(f"{prefix}stats", "completed") or 0) < n:
        time.sleep(0.05)
        if time.monotonic() - started > limit_s:
            raise RuntimeError(f"{n} imports did not complete in {limit_s:.0f} s")


def _settled_memory(client: redis.Redis, prefix: str, ledger_on: bool) -> int:
    """used_memory once retention removed the job records and, ledger on, the exporter
    trimmed the journal and receipts and pruned the done markers; the stock hash is
    left out (the stock levels grow with the distinct SKUs, not with the shipments)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and client.zcard(f"{prefix}jobs:completed") > 0:
        time.sleep(0.2)
    if ledger_on:
        while time.monotonic() < deadline and (client.zcard(f"{prefix}ledger:markers") > 0 or client.xlen(f"{prefix}journal") > 0):
            time.sleep(0.2)
    time.sleep(1)
    client.execute_command("MEMORY", "PURGE")
    return int(client.info("memory")["used_memory"]) - int(client.memory_usage(f"{prefix}stock") or 0)


def one_round(n: int, ledger_on: bool, work: Path, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """``extra_env``: more settings for the round's processes (bench/studies/tracing.py: tracing on)."""
    prefix = "{bench}:"
    procs: list[subprocess.Popen[bytes]] = []
    out: dict[str, Any] = {"ledger": ledger_on}
    with _servers(work, ledger_on, prefix) as (url, db, env, client):
        try:
            out["memory_before"] = int(client.info("memory")["used_memory"])
            preenqueue_importer(url, env, n, "drain", csv_3rows)
            env.update(extra_env or {})  # the processes' (the producer above runs in this process)
            if ledger_on:
                # Running before the timed drain, as an exporter in production does: its
                # start (imports, connections, migrations) is no cost of the drain's imports.
                ledger_log = work / "ledger.log"
                seen = ledger_log.stat().st_size if ledger_log.exists() else 0
                procs.append(_spawn(["ledger"], env, ledger_log))
                _wait_ready(ledger_log, seen, procs[-1])
            lags: list[tuple[int, float]] = []
            stop = threading.Event()
            if ledger_on:
                from importer.adapters.bootstrap import clock_ms, redis_client
                from importer.adapters.postgres.ledger import PostgresLedger
                from importer.adapters.processes.ledger import export_lags
                from importer.adapters.redis.store import RedisStore
                from importer.adapters.settings import Settings

                settings = Settings.from_env(env)
                store = RedisStore(redis_client(settings), settings, clock_ms=clock_ms)
                ledger = PostgresLedger(db or "", max_size=1).open()

                def sample() -> None:
                    while not stop.wait(0.1):
                        try:
                            lag = export_lags(store, ledger, ["main"])[0]
                            lags.append((lag.entries, lag.seconds))
                        except Exception:  # the schema not there yet at the very start
                            pass

                sampler = threading.Thread(target=sample, daemon=True)
            started = time.monotonic()
            procs.append(_spawn(["worker", "--processes", "1", "--threads", "2"], env, work / "worker.log"))
            if ledger_on:
                sampler.start()
            _wait_completed(client, prefix, n)
            out["imports_per_s"] = n / (time.monotonic() - started)
            if ledger_on:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and (not lags or lags[-1][0] > 0):
                    time.sleep(0.1)
                stop.set()
                sampler.join(5)
                ages = sorted(s for _, s in lags)
                out["lag_p99_s"] = ages[int(0.99 * (len(ages) - 1))] if ages else None
                out["lag_max_entries"] = max((e for e, _ in lags), default=0)
            out["memory_after"] = _settled_memory(client, prefix, ledger_on)
            out["markers_left"] = sum(1 for _ in client.scan_iter(match=f"{prefix}done:*", count=1000))
            if ledger_on:
                # 3. one 100,000-row shipment, exported by one pass of an in-process exporter
                from importer.adapters.processes.ledger import Exporter

                for proc in procs:
                    if "ledger" in proc.args:
                        _stop(proc)
                preenqueue_importer(url, env, 1, "large", lambda i: csv_rows(100_000))
                _wait_completed(client, prefix, n + 1)
                exporter = Exporter(store, ledger, settings)
                t0 = time.monotonic()
                exporter.pass_once()
                out["export_100k_s"] = time.monotonic() - t0
                ledger.close()
            return out
        finally:
            for proc in procs:
                _stop(proc)


def memory_round(small: int, large: int, ledger_on: bool, work: Path) -> dict[str, int]:
    """Redis used_memory growth (bytes) after ``small`` 3-row shipments, then after
    ``large`` more of 100,000 rows, each drained by a worker with (on) the exporter
    running, once retention and the exporter have had their way (hot window and
    horizon 0): {"small": growth, "large": growth}."""
    prefix = "{benchmem}:"
    out: dict[str, int] = {}
    with _servers(work, ledger_on, prefix) as (url, db, env, client):
        before = int(client.info("memory")["used_memory"])
        procs = [_spawn(["worker", "--processes", "1", "--threads", "2"], env, work / "worker.log")]
        if ledger_on:
            procs.append(_spawn(["ledger"], env, work / "ledger.log"))
        try:
            preenqueue_importer(url, env, small, "small", csv_3rows)
            _wait_completed(client, prefix, small)
            out["small"] = _settled_memory(client, prefix, ledger_on) - before
            preenqueue_importer(url, env, large, "large", lambda i: csv_rows(100_000))
            _wait_completed(client, prefix, small + large)
            out["large"] = _settled_memory(client, prefix, ledger_on) - before
        finally:
            for proc in procs:
                _stop(proc)
    return out


def wait_healthy(port: int, limit_s: float = 60) -> None:
    """Until `importer serve` on ``port`` answers /health with 200 (at most ``limit_s``)."""
    import urllib.request

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)


def http_round(ledger_on: bool, work: Path, seconds: int, extra_env: dict[str, str] | None = None) -> dict[str, float] | None:
    """wrk POSTing unique 3-row batches to `importer serve` (its defaults) with a worker
    draining, the ledger's exporter running (on) or not: req/s and p99. None without wrk."""
    wrk = shutil.which("wrk")
    if wrk is None:
        return None
    from bench.suite.common import free_port
    from bench.suite.http_load import parse_wrk
    from importer.handlers.auth import hash_key, new_key

    work.mkdir(parents=True, exist_ok=True)
    valkey = EmbeddedRedis(work / "valkey")
    url = valkey.start()
    pg = EmbeddedPostgres(work / "pg" / "data") if ledger_on else None
    db = pg.start() if pg else None
    key = new_key()
    env = _env(url, db, "{benchhttp}:")
    env.update(IMPORTER_API_KEYS=f"bench:{hash_key(key)}", IMPORTER_KEEP_COMPLETED_AGE="3600",
               IMPORTER_KEEP_COMPLETED_COUNT="100", IMPORTER_LEDGER_HOT_WINDOW="3600",
               IMPORTER_IDEMPOTENCY_HORIZON="604800", **(extra_env or {}))
    port = free_port()
    procs = [_spawn(["worker"], env, work / "worker.log"), _spawn(["serve", "--bind", f"127.0.0.1:{port}"], env, work / "http.log")]
    if ledger_on:
        procs.append(_spawn(["ledger"], env, work / "ledger.log"))
    try:
        wait_healthy(port)
        run_env = dict(os.environ, BENCH_RUN_ID=uuid.uuid4().hex[:8], BENCH_API_KEY=key)
        done = subprocess.run(
            [wrk, "-t2", "-c32", f"-d{seconds}s", "--latency", "-s", str(ROOT / "bench" / "suite" / "wrk_post.lua"),
             f"http://127.0.0.1:{port}/api/imports"], env=run_env, capture_output=True, text=True, timeout=seconds + 60,
        )
        return parse_wrk(done.stdout)
    finally:
        for proc in procs:
            _stop(proc)
        if pg:
            pg.stop()
        valkey.stop()
        shutil.rmtree(work, ignore_errors=True)


def scenario_ledger(b: Bench) -> None:
    c = b.cfg
    res = b.results
    n = c.drain_ns[0]
    sc = f"7. ledger (drain of {n:,}, ledger on ÷ off)"
    drain = res.row(sc, "drain imports/s", "/s", base_label="ledger off", target=_base_at_least(0.9))
    lag = res.row(sc, "export lag p99 during the drain", "s", target=at_most(1.0, "s"))
    grown = res.row(sc, "Redis used_memory growth after the drain (records removed, stock hash excluded)", "MiB", base_label="ledger off")
    export = res.row(sc, "one 100,000-row shipment exported", "s", target=at_most(1.0, "s"))
    http = res.row(sc, f"HTTP enqueue req/s (wrk -t2 -c32 {c.duration} s, importer serve)", "/s",
                   base_label="ledger off", target=_base_at_least(0.9))
    http_p99 = res.row(sc, "HTTP enqueue p99", "ms", base_label="ledger off")
    restored = (20_000 if c.quick else 100_000)
    restore = res.row(sc, f"{restored:,} shipments of 3 rows brought forward from the ledger into an empty Redis "
                          "(importer ledger restore)", "s", target=at_most(10.0, "s"))
    small, large = (20_000, 2) if c.quick else (200_000, 20)
    flat = _at_most_times(grown, 1.1, f"the {n:,}-drain's growth")
    mem_small = res.row(sc, f"Redis used_memory growth after {small:,} small shipments (the same)", "MiB",
                        base_label="ledger off", target=flat)
    mem_large = res.row(sc, f"... then after {large} more of 100,000 rows", "MiB", base_label="ledger off",
                        target=_at_most_times(mem_small, 1.1, f"the growth after {small:,}"))
    # Not under the bench's 0700 folder: as root the embedded PostgreSQL runs as 'nobody'.
    base = Path(tempfile.mkdtemp(prefix="importer-bench-ledger-"))
    base.chmod(0o755)
    for rep in range(c.repeat):
        for on in (False, True):
            log(f"ledger rep {rep + 1}/{c.repeat}: {'on' if on else 'off'}")
            out = one_round(n, on, base / f"{rep}-{'on' if on else 'off'}")
            per_import = (out["memory_after"] - out["memory_before"]) / (1 << 20)
            if on:
                drain.imp.append(out["imports_per_s"])
                grown.imp.append(per_import)
                if out.get("lag_p99_s") is not None:
                    lag.imp.append(out["lag_p99_s"])
                export.imp.append(out["export_100k_s"])
            else:
                drain.base.append(out["imports_per_s"])
                grown.base.append(per_import)
            posted = http_round(on, base / f"{rep}-http-{'on' if on else 'off'}", c.duration)
            if posted is None:
                http.note = "skipped (wrk not found)"
            else:
                (http.imp if on else http.base).append(posted["rps"])
                (http_p99.imp if on else http_p99.base).append(posted["p99_ms"])
    for rep in range(c.repeat):
        log(f"ledger restore rep {rep + 1}/{c.repeat}: {restored:,} shipments")
        with _servers(base / f"{rep}-restore", True, "{restore}:") as (url, db, _, _client):
            assert db is not None
            restore.imp.append(restore_round(url, db, restored)["restore_s"])
    for on in (False, True):  # once: memory after many shipments moves little between runs
        log(f"ledger memory: {small:,} small then {large} of 100,000 rows, {'on' if on else 'off'}")
        mem = memory_round(small, large, on, base / f"memory-{'on' if on else 'off'}")
        (mem_small.imp if on else mem_small.base).append(mem["small"] / (1 << 20))
        (mem_large.imp if on else mem_large.base).append(mem["large"] / (1 << 20))
    shutil.rmtree(base, ignore_errors=True)


def _at_most_times(reference: Any, limit: float, what: str) -> Any:
    """Ledger on: the growth stays within ``limit`` × ``reference``'s (it does not grow with the shipments)."""
    from bench.suite.report import _verdict, median

    def check(row: Any) -> tuple[str, str]:
        if not row.imp or not reference.imp:
            return f"≤ {limit:g}× {what}", "n/a"
        rt = median(row.imp) / median(reference.imp)
        return f"≤ {limit:g}× {what}", _verdict(rt <= limit, rt, limit)
    return check


def _base_at_least(limit: float) -> Any:
    from bench.suite.report import _verdict, ratio_of

    def check(row: Any) -> tuple[str, str]:
        rt = ratio_of(row.imp, row.base)
        return f"≥ {limit:g}× ledger off", ("n/a" if rt is None else _verdict(rt >= limit, rt, limit))
    return check
