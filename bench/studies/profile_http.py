"""Profile of the HTTP process on POST /api/imports: Redis round trips per POST,
req/s and p99 under wrk, and where the CPU goes (py-spy, when installed).

    .venv/bin/python -m bench.studies.profile_http --importer /path/to/venv/bin/importer [--server gunicorn] \\
        [--redis-port 16399] [--seconds 10] [--repeat 3] [--rows 3] [--py-spy]

--importer picks the code under test (another checkout's venv measures "before").
It starts its own redis-server on --redis-port unless one answers there.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
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
import urllib.request
import uuid
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from importer.handlers.auth import hash_key  # noqa: E402

from bench.suite.http_load import parse_wrk  # noqa: E402

API_KEY = "imp_profile_" + "p" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def csv_rows(n: int, tag: str) -> bytes:
    return ("sku,quantity\n" + "".join(f"{tag}-{i},{i % 1000 + 1}\n" for i in range(n))).encode()


def post(port: int, batch: str, body: bytes) -> int:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/imports?batchId={batch}", data=body, method="POST",
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "text/csv"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status


def monitor_counts(url: str, port: int, n: int) -> dict[str, float]:
    """Top-level commands and commands run inside scripts, per POST (MONITOR)."""
    client = redis.Redis.from_url(url)
    lines: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        with client.monitor() as m:
            for cmd in m.listen():
                lines.append(f"{cmd.get('client_type', '')} {cmd['command']}")
                if stop.is_set():
                    break

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    time.sleep(0.5)
    tag = uuid.uuid4().hex[:6]
    for i in range(n):
        post(port, f"mon-{tag}-{i}", csv_rows(3, tag))
    time.sleep(0.5)
    stop.set()
    client.ping()  # wakes the monitor
    t.join(timeout=5)
    top = collections.Counter()
    inner = collections.Counter()
    for line in lines:
        kind, _, command = line.partition(" ")
        name = command.split(" ", 1)[0].upper()
        if name in ("PING", "MONITOR"):
            continue
        (inner if kind == "lua" else top)[name] += 1
    return {
        "top_level_per_post": round(sum(top.values()) / n, 2),
        "inside_scripts_per_post": round(sum(inner.values()) / n, 2),
        "top": {k: round(v / n, 2) for k, v in top.most_common()},  # type: ignore[dict-item]
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--importer", default=str(Path(sys.executable).parent / "importer"))
    ap.add_argument("--server", default="")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--redis-port", type=int, default=16399)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rows", type=int, default=3, help="rows per POST for the py-spy profile of large uploads")
    ap.add_argument("--py-spy", action="store_true")
    args = ap.parse_args()

    url = f"redis://127.0.0.1:{args.redis_port}/0"
    redis_proc = None
    try:
        redis.Redis.from_url(url).ping()
    except redis.ConnectionError:
        redis_proc = subprocess.Popen(
            ["/usr/bin/redis-server", "--port", str(args.redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tempfile.mkdtemp()], stdout=subprocess.DEVNULL,
        )
        time.sleep(0.5)
    port = free_port()
    env = dict(
        os.environ, IMPORTER_REDIS_URL=url, IMPORTER_KEY_PREFIX="{prof" + uuid.uuid4().hex[:6] + "}:",
        IMPORTER_RATE_LIMIT="0", IMPORTER_API_KEYS=f"prof:{hash_key(API_KEY)}", IMPORTER_HTTP_DRAIN_DELAY="0",
        IMPORTER_KEEP_COMPLETED_COUNT="10000000",
    )
    argv = [args.importer, "serve", "--bind", f"127.0.0.1:{port}", "--workers", str(args.workers), "--threads", str(args.threads)]
    if args.server:
        argv += ["--server", args.server]
    log = open(tempfile.gettempdir() + "/profile-http.log", "wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, start_new_session=True)
    out: dict[str, object] = {"importer": args.importer, "server": args.server or "(default)"}
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.1)
        out["redis_per_post"] = monitor_counts(url, port, 200)
        runs = []
        wrk_env = dict(env, BENCH_API_KEY=API_KEY)
        for rep in range(args.repeat + 1):
            wrk_env["BENCH_RUN_ID"] = "p" + uuid.uuid4().hex[:8]
            secs = 1 if rep == 0 else args.seconds
            cmd = ["/usr/bin/wrk", "-t2", "-c32", f"-d{secs}s", "--latency", "-s", str(ROOT / "bench" / "suite" / "wrk_post.lua"),
                   f"http://127.0.0.1:{port}/api/imports"]
            spy = None
            if args.py_spy and rep == 1 and shutil.which("py-spy", path=str(Path(sys.executable).parent)):
                workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()]
                spy = subprocess.Popen(
                    [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(workers[0]), "-d", str(secs - 1),
                     "-f", "raw", "-o", tempfile.gettempdir() + "/profile-http.raw", "--nonblocking", "--threads"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
            done = subprocess.run(cmd, env=wrk_env, capture_output=True, text=True)
            if spy is not None:
                spy.wait(timeout=60)
            if rep:
                runs.append(parse_wrk(done.stdout))
        out["rps"] = [r["rps"] for r in runs]
        out["p99_ms"] = [r["p99_ms"] for r in runs]
        out["median_rps"] = statistics.median(out["rps"])  # type: ignore[arg-type]
        out["median_p99_ms"] = statistics.median(out["p99_ms"])  # type: ignore[arg-type]
        if args.py_spy and os.path.exists(tempfile.gettempdir() + "/profile-http.raw"):
            out["py_spy_self_top"] = top_self(Path(tempfile.gettempdir() + "/profile-http.raw"))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        if redis_proc is not None:
            redis_proc.terminate()
    print(json.dumps(out, indent=1))
    return 0


def top_self(raw: Path, n: int = 15) -> list[str]:
    """Leaf frames by share of samples (idle waits excluded)."""
    leaf: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        last = frames[-1]
        if re.search(r"\b(wait|select|poll|_wait_for_tstate_lock|accept)\b", last):
            continue
        leaf[re.sub(r" \(.*?/(site-packages|lib/python3\.\d+|wt/\w+|main)/", " (", last)] += int(count)
        total += int(count)
    return [f"{100 * c / total:.1f}% {name}" for name, c in leaf.most_common(n)]


if __name__ == "__main__":
    raise SystemExit(main())
