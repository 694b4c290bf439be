"""2. HTTP enqueue: wrk POSTing unique 3-row batches to ``importer serve``, to the BullMQ peer's server and
to a bare WSGI app under the same server (granian or gunicorn) and settings. The bench never installs wrk: it says what is missing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from typing import TYPE_CHECKING

from importer.adapters.redis.keys import Keys

from bench.suite.common import (
    ROOT,
    BenchError,
    OtherLoad,
    children,
    cpu_seconds,
    log,
    new_prefix,
)
from bench.suite.procs import Proc
from bench.suite.report import base_at_least, median, peer_at_least, peer_at_most, ratio_of

if TYPE_CHECKING:
    from bench.suite.servers import Bench

FIELD = {"importer": "imp", "peer": "peer", "bare": "base"}
FLOOR = "bare WSGI app + one EVALSHA like enqueue.lua's, granian, same processes × threads"
UNSHARED = "Importer with IMPORTER_SHARE_ROUND_TRIPS=0: one Redis round trip per POST"
#: Seconds of the one-client run (wrk -t1 -c1) after each subject's main run, on the same server.
SINGLE_S = 3
SINGLE = ("importer", "unshared", "peer")


def find_wrk(b: Bench) -> str | None:
    found = shutil.which("wrk")
    if not found:
        b.wrk_note = "wrk not found: HTTP enqueue figures skipped (install it, e.g. `apt-get install wrk`, and re-run)"
    return found


def run_wrk(
    b: Bench, port: int, seconds: int, run_id: str, *, threads: int = 2, connections: int = 32, bulk: int = 0,
) -> dict[str, float]:
    """wrk POSTing one shipment per request (wrk_post.lua), or ``bulk`` per request (wrk_bulk.lua)."""
    assert b.wrk is not None
    env = dict(b.base_env, BENCH_RUN_ID=run_id, BENCH_API_KEY=b.api_key, BENCH_BULK=str(bulk))
    script = "wrk_bulk.lua" if bulk else "wrk_post.lua"
    argv = [
        b.wrk, f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(ROOT / "bench" / "suite" / script),
        f"http://127.0.0.1:{port}/api/imports",
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 60)
    if done.returncode != 0:
        raise BenchError(f"wrk exited {done.returncode}: {done.stderr.strip()[:300]}")
    return parse_wrk(done.stdout)


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


def start(b: Bench, which: str, prefix: str) -> tuple[Proc, int]:
    if which == "importer":
        return b.start_serve(b.importer_env(prefix))
    if which == "unshared":
        return b.start_serve(dict(b.importer_env(prefix), IMPORTER_SHARE_ROUND_TRIPS="0"))
    if which == "peer":
        assert b.peer is not None
        return b.peer.start_server(prefix[:-1])
    if which == "floor":
        return b.start_floor()
    return b.start_bare()


def jobs_created(b: Bench, which: str, prefix: str) -> str:
    assert b.client is not None
    if which in ("importer", "unshared"):
        return f", {b.client.zcard(Keys(prefix).waiting):,} jobs waiting in Redis (incl. warm-up)"
    if which == "peer" and b.peer is not None:
        return f", {b.client.llen(b.peer.key(prefix[:-1], 'wait')):,} jobs waiting in Redis (incl. warm-up)"
    return ""


def scenario_http(b: Bench) -> None:
    c = b.cfg
    res = b.results
    label = f"wrk -t2 -c32 {c.duration}s; Importer {c.http_server} {c.http_workers}w×{c.http_threads}t, peer one node process"
    bare = f"bare WSGI app, {c.http_server}"
    rps = res.row("2. HTTP enqueue", f"req/s ({label})", "/s", base_label=bare, target=peer_at_least(0.4))
    p50 = res.row("2. HTTP enqueue", "latency p50", "ms", base_label=bare)
    p99 = res.row("2. HTTP enqueue", "latency p99", "ms", base_label=bare, target=peer_at_most(1.5))
    # The floor of the threaded design: the same processes and threads making the POST's one
    # Redis call with no Importer code (bench/suite/model_apps.py), so each run shows how much of
    # Importer's p99 is its own work and how much the server model's.
    floor_rps = res.row("2. HTTP enqueue", "req/s, beside the floor of the threaded design", "/s", base_label=FLOOR,
                        target=base_at_least(0.8, "the floor"))
    floor_p99 = res.row("2. HTTP enqueue", "latency p99, beside the floor of the threaded design", "ms", base_label=FLOOR)
    # Group commit on the HTTP side, before/after in the same run: the same server with each POST
    # its own round trip; and the latency of one client alone (a lone POST must not wait for company).
    unshared_rps = res.row("2. HTTP enqueue", "req/s, beside one round trip per POST", "/s", base_label=UNSHARED)
    unshared_p99 = res.row("2. HTTP enqueue", "latency p99, beside one round trip per POST", "ms", base_label=UNSHARED)
    single_p50 = res.row("2. HTTP enqueue", f"one client alone (wrk -t1 -c1 {SINGLE_S}s): latency p50", "ms", base_label=UNSHARED)
    single_rps = res.row("2. HTTP enqueue", f"one client alone (wrk -t1 -c1 {SINGLE_S}s): req/s", "/s", base_label=UNSHARED)
    # Where each POST's CPU goes, over the timed run: the Redis server's and the HTTP processes' (÷ wrk's requests).
    server_cpu = res.row("2. HTTP enqueue", "Redis server CPU per POST", "µs", decimals=1, base_label=FLOOR)
    http_cpu = res.row("2. HTTP enqueue", "HTTP process CPU per POST", "ms", decimals=3, base_label=FLOOR)
    # Importer's and the peer's figures are those of the rows above (the same lists); only the baseline differs.
    floor_rps.imp, floor_rps.peer, floor_p99.imp, floor_p99.peer = rps.imp, rps.peer, p99.imp, p99.peer
    unshared_rps.imp, unshared_rps.peer, unshared_p99.imp, unshared_p99.peer = rps.imp, rps.peer, p99.imp, p99.peer
    b.wrk = find_wrk(b)
    if not b.wrk:
        for r in (rps, p50, p99, floor_rps, floor_p99, unshared_rps, unshared_p99, single_p50, single_rps, server_cpu, http_cpu):
            r.note = "skipped (wrk not found)"
        log(b.wrk_note)
        res.notes.append(b.wrk_note)
        return
    subjects = ("importer", "unshared", "peer", "floor", "bare") if b.peer is not None else ("importer", "unshared", "floor", "bare")
    for rep in range(c.repeat):
        for which in subjects:
            log(f"http rep {rep + 1}/{c.repeat}: {which}")
            proc = None
            try:
                prefix = new_prefix("http")
                proc, port = start(b, which, prefix)
                run_id = f"h{uuid.uuid4().hex[:8]}"
                run_wrk(b, port, 1, run_id + "w")  # warm-up: every worker thread, lazy imports, JIT
                served = proc
                workers = children(served.popen.pid) or [served.popen.pid]
                cpu0 = [cpu_seconds(w) for w in workers]
                load = OtherLoad(lambda: [os.getpid(), b.server_pid, served.popen.pid])
                server0 = cpu_seconds(b.server_pid)
                fig = run_wrk(b, port, c.duration, run_id)
                fig.update(load.stop())
                per_post = max(fig["requests"], 1.0)
                fig["server_cpu_us"] = (cpu_seconds(b.server_pid) - server0) * 1e6 / per_post
                fig["http_cpu_ms"] = sum(cpu_seconds(w) - c0 for w, c0 in zip(workers, cpu0)) * 1e3 / per_post
                alone = run_wrk(b, port, SINGLE_S, run_id + "s", threads=1, connections=1) if which in SINGLE else None
                spent = [cpu_seconds(w) - c0 for w, c0 in zip(workers, cpu0)]
                split = "/".join(f"{x:.1f}" for x in spent)
                imbalance = max(spent) / sum(spent) if len(spent) > 1 and sum(spent) > 0 else 0.0
                b.other_load.append(fig["other_pct"])
                created = jobs_created(b, which, prefix)
            except (BenchError, subprocess.TimeoutExpired) as exc:
                log(f"http {which} failed: {exc}")
                res.notes.append(f"HTTP {which} rep {rep + 1} failed: {exc}")
                continue
            finally:
                if proc is not None:
                    b.procs.stop(proc)
                b.flush()
            if alone is not None:
                field = "base" if which == "unshared" else FIELD[which]
                getattr(single_p50, field).append(alone["p50_ms"])
                getattr(single_rps, field).append(alone["rps"])
            if which in ("importer", "peer", "floor"):
                field = "base" if which == "floor" else FIELD[which]
                getattr(server_cpu, field).append(fig["server_cpu_us"])
                getattr(http_cpu, field).append(fig["http_cpu_ms"])
            if which == "floor":
                floor_rps.base.append(fig["rps"])
                floor_p99.base.append(fig["p99_ms"])
            elif which == "unshared":
                unshared_rps.base.append(fig["rps"])
                unshared_p99.base.append(fig["p99_ms"])
            else:
                target = FIELD[which]
                getattr(rps, target).append(fig["rps"])
                getattr(p50, target).append(fig["p50_ms"])
                getattr(p99, target).append(fig["p99_ms"])
            single = f"; one client alone: p50 {alone['p50_ms']:.2f} ms, {alone['rps']:,.0f} req/s" if alone else ""
            msg = (
                f"{which}: {fig['rps']:,.0f} req/s, p50 {fig['p50_ms']:.2f} ms, p99 {fig['p99_ms']:.2f} ms, "
                f"{int(fig['requests']):,} requests, non-2xx {int(fig['non2xx'])}, socket errors {int(fig['socket_errors'])}{created}; "
                f"CPU per request: Redis {fig['server_cpu_us']:.1f} µs, HTTP processes {fig['http_cpu_ms']:.3f} ms; "
                f"CPU s of each server process {split}; other processes on the machine {fig['other_pct']:.0f}% of a core "
                f"(steal {fig['steal_pct']:.0f}%){single}"
            )
            log("  " + msg)
            res.details.append(f"HTTP rep {rep + 1} {msg}")
            if imbalance > 0.7:
                res.notes.append(
                    f"HTTP {which} rep {rep + 1}: one HTTP worker process did {imbalance * 100:.0f}% of the work "
                    f"(CPU s per worker {split}): wrk's 32 keep-alive connections were spread unevenly over "
                    "the workers, so this run measures mostly one process"
                )
            if fig["non2xx"] or fig["socket_errors"]:
                res.notes.append(f"HTTP {which} rep {rep + 1}: {int(fig['non2xx'])} non-2xx responses, {int(fig['socket_errors'])} socket errors")
    if floor_p99.base and floor_p99.peer:
        res.notes.append(
            f"2. HTTP enqueue: the floor of the threaded design ({FLOOR}) had a p99 of "
            f"{median(floor_p99.base):.1f} ms, {ratio_of(floor_p99.base, floor_p99.peer):.2f}× the peer's in the same run; "
            f"its req/s {ratio_of(floor_rps.base, floor_rps.peer):.2f}× the peer's"
        )


#: shipments per request of scenario 2b
BULK = 100
#: connections of scenario 2b: each request carries BULK shipments
BULK_CONNECTIONS = 8


def _recorded(b: Bench, which: str, prefix: str) -> int:
    assert b.client is not None
    if which == "importer":
        return int(b.client.zcard(Keys(prefix).waiting))
    assert b.peer is not None
    return int(b.client.llen(b.peer.key(prefix[:-1], "wait")))


def scenario_bulk_http(b: Bench) -> None:
    """2b. bulk HTTP: wrk POSTing 100 new shipments per request to Importer's POST /api/imports/bulk and to the
    peer's route calling addBulk; shipments/s (each shipment recorded and its message sent) and Redis CPU per one."""
    c = b.cfg
    res = b.results
    label = f"{BULK} per request, wrk -t2 -c{BULK_CONNECTIONS} {c.duration}s"
    rate = res.row("2b. bulk HTTP", f"shipments/s ({label})", "/s", target=peer_at_least(1.0))
    p99 = res.row("2b. bulk HTTP", "request latency p99", "ms")
    scpu = res.row("2b. bulk HTTP", "Redis server CPU per shipment", "µs", decimals=1)
    hcpu = res.row("2b. bulk HTTP", "HTTP process CPU per shipment", "ms", decimals=3)
    b.wrk = b.wrk or find_wrk(b)
    if not b.wrk or b.peer is None:
        for r in (rate, p99, scpu, hcpu):
            r.note = "skipped (wrk not found)" if not b.wrk else r.note
        if not b.wrk:
            return
    for rep in range(c.repeat):
        for which in ("importer", "peer") if b.peer is not None else ("importer",):
            log(f"bulk http rep {rep + 1}/{c.repeat}: {which}")
            proc = None
            try:
                prefix = new_prefix("bulkhttp")
                proc, port = start(b, which, prefix)
                run_id = f"b{uuid.uuid4().hex[:8]}"
                run_wrk(b, port, 1, run_id + "w", connections=BULK_CONNECTIONS, bulk=BULK)  # warm-up
                warm = _recorded(b, which, prefix)
                workers = children(proc.popen.pid) or [proc.popen.pid]
                cpu0 = [cpu_seconds(w) for w in workers]
                server0 = cpu_seconds(b.server_pid)
                fig = run_wrk(b, port, c.duration, run_id, connections=BULK_CONNECTIONS, bulk=BULK)
                server_s = cpu_seconds(b.server_pid) - server0
                http_s = sum(cpu_seconds(w) for w in workers) - sum(cpu0)
                recorded = _recorded(b, which, prefix) - warm
            except (BenchError, subprocess.TimeoutExpired) as exc:
                log(f"bulk http {which} failed: {exc}")
                res.notes.append(f"bulk HTTP {which} rep {rep + 1} failed: {exc}")
                continue
            finally:
                if proc is not None:
                    b.procs.stop(proc)
                b.flush()
            sent = fig["requests"] * BULK
            if fig["non2xx"] or fig["socket_errors"] or recorded < sent:
                res.notes.append(
                    f"bulk HTTP {which} rep {rep + 1}: {int(fig['non2xx'])} non-2xx, {int(fig['socket_errors'])} socket errors, "
                    f"{recorded:,} of {int(sent):,} shipments recorded"
                )
            target = FIELD[which]
            getattr(rate, target).append(fig["rps"] * BULK)
            getattr(p99, target).append(fig["p99_ms"])
            getattr(scpu, target).append(server_s * 1e6 / max(recorded, 1))
            getattr(hcpu, target).append(http_s * 1e3 / max(recorded, 1))
            msg = (f"{which}: {fig['rps'] * BULK:,.0f} shipments/s ({fig['rps']:,.1f} req/s), p99 {fig['p99_ms']:.1f} ms, "
                   f"{recorded:,} shipments recorded of {int(sent):,} sent; Redis {server_s * 1e6 / max(recorded, 1):.1f} µs "
                   f"and HTTP {http_s * 1e3 / max(recorded, 1):.3f} ms CPU per shipment")
            log("  " + msg)
            res.details.append(f"bulk HTTP rep {rep + 1} {msg}")
