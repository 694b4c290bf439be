"""Accounting (not timed): every Redis command Importer's worker side sends per import, by script
(one drain under MONITOR), and the server time of each (a second drain with SLOWLOG at 0 µs)."""

from __future__ import annotations

import re
import socket
import threading
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING

import redis

from bench.suite.common import (
    BenchError,
    end_slowlog,
    log,
    script_names,
    slowlog_words,
    tail,
)
from bench.suite.drain import setup

if TYPE_CHECKING:
    from bench.suite.servers import Bench


WORKER = {"importer": "`importer worker`", "peer": "the BullMQ peer's `worker.js`"}


def names_for(b: Bench, which: str) -> dict[str, str]:
    if which == "peer":
        assert b.peer is not None
        return b.peer.script_names()
    return script_names()


def scenario_accounting(b: Bench) -> None:
    for which in ("importer", "peer") if b.peer is not None else ("importer",):
        try:
            account(b, which)
        except BenchError as exc:
            b.results.notes.append(f"accounting {which} failed: {exc}")


def account(b: Bench, which: str) -> None:
    """One separate drain under MONITOR: every command the worker side sends, by script."""
    n = b.cfg.accounting_n
    log(f"accounting: {n} imports under MONITOR (not timed): {which}")
    tag = f"a{uuid.uuid4().hex[:8]}"
    su = setup(b, which, n, tag)
    completed_key = su.probe[0][1]
    sha_names = names_for(b, which)
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
            sock = socket.create_connection(("127.0.0.1", int(b.url.rsplit(":", 1)[1].split("/")[0])), timeout=5)
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

    poller = redis.Redis.from_url(b.url, single_connection_client=True)
    poller_addrs.add(str(poller.client_info()["addr"]))
    thread = threading.Thread(target=monitor, name="bench-monitor", daemon=True)
    thread.start()
    ready.wait(10)
    proc = b.procs.spawn(f"accounting-{which}-worker", su.argv, su.env)
    try:
        deadline = time.monotonic() + 120
        while poller.zcard(completed_key) < n:
            if proc.popen.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"accounting drain did not finish: {tail(proc.log_path, 5)}")
            time.sleep(0.02)
    except BenchError as exc:
        b.results.notes.append(f"accounting {which} failed: {exc}")
        return
    finally:
        b.procs.stop(proc)
        poller.close()
        stop.set()
        thread.join(15)
        b.flush()
    if errors:
        b.results.notes.append(f"accounting {which} (MONITOR) failed: {errors[0]}")
        return
    acct = {"n": n, "top": top, "inner": inner, "by_script": inner_by_script, "usec": {}}
    b.accounting[which] = acct
    total_top = sum(top.values())
    log(f"  worker side sends {total_top / n:.2f} commands per import ({sum(v for k, v in top.items() if k.startswith('EVAL')) / n:.2f} scripts), "
        f"and the scripts run {sum(inner.values()) / n:.1f} commands per import")
    try:
        acct["usec"] = server_time_by_command(b, which, n)
    except BenchError as exc:
        b.results.notes.append(f"accounting {which} (SLOWLOG pass) failed: {exc}")


def server_time_by_command(b: Bench, which: str, n: int) -> dict[str, tuple[int, float]]:
    """Another untimed drain with `slowlog-log-slower-than 0` (no MONITOR, which would slow the
    scripts' inner calls): server execution time of each top-level command, by script."""
    assert b.client is not None
    log(f"accounting: {n} imports with SLOWLOG at 0 µs (not timed): {which}")
    su = setup(b, which, n, f"s{uuid.uuid4().hex[:8]}")
    completed_key = su.probe[0][1]
    names = names_for(b, which)
    b.client.config_set("slowlog-max-len", 50 * n + 1000)
    b.client.config_set("slowlog-log-slower-than", 0)
    b.client.slowlog_reset()
    proc = b.procs.spawn(f"slowlog-{which}-worker", su.argv, su.env)
    try:
        deadline = time.monotonic() + 120
        while b.client.zcard(completed_key) < n:
            if proc.popen.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"drain did not finish: {tail(proc.log_path, 5)}")
            time.sleep(0.02)
        entries = b.client.slowlog_get(-1)
    finally:
        b.procs.stop(proc)
        end_slowlog(b.client)
        b.flush()
    totals: dict[str, list[int]] = {}
    for entry in entries:
        name, arg = slowlog_words(entry)
        if name in ("ZCARD", "SLOWLOG", "CONFIG"):  # the bench's own polling and settings
            continue
        label = f"EVALSHA {names.get(arg, 'other script')}" if name == "EVALSHA" else (
            f"{name} {arg.upper()}" if name in ("SCRIPT", "CLIENT") else name)
        totals.setdefault(label, []).append(int(entry["duration"]))
    return {k: (len(v), sum(v) / len(v)) for k, v in totals.items()}


def accounting_markdown(b: Bench) -> str:
    if not b.accounting:
        return "(not measured in this run)"
    n = next(iter(b.accounting.values()))["n"]
    parts = [
        f"One extra, untimed drain of {n:,} 3-row imports per system under `MONITOR`: `importer worker` "
        f"({b.cfg.processes} process(es), {b.cfg.threads} threads, prefetch {b.cfg.prefetch or 'default'}) and the "
        f"BullMQ peer's `worker.js` (concurrency {b.cfg.peer_concurrency}). Counts include the worker's boot and "
        "shutdown (negligible), exclude the bench's own polling (and, for the peer, the `node enqueue.js` producer, "
        "which ran before).",
        "",
        "The server time per call is the mean SLOWLOG duration of that command in a second untimed drain "
        "of the same size, with `slowlog-log-slower-than 0` and no MONITOR (execution only, no I/O). "
        "ioredis sends the first call of a script on each connection as `EVAL <source>` (counted as EVAL), "
        "then `EVALSHA`.",
    ]
    for which, acct in b.accounting.items():
        parts += ["", f"### {WORKER[which]}", "", table_markdown(acct)]
    return "\n".join(parts)


def table_markdown(acct: dict) -> str:  # type: ignore[type-arg]
    n = acct["n"]
    lines = [
        "| sent by the worker (top level) | per import | server µs per call | run inside that script | per import |",
        "| --- | --- | --- | --- | --- |",
    ]
    usec = acct.get("usec", {})
    for name, count in acct["top"].most_common():
        script = name.replace("EVALSHA ", "")
        inner = acct["by_script"].get(script, Counter()) if name.startswith("EVAL") else Counter()
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

