"""Which HTTP server for ``importer serve``: a side-by-side measurement.

    .venv/bin/python -m bench.studies.http_servers [--seconds 10] [--only gunicorn,granian] [--skip-wrk] [--skip-slow]

For each server (gunicorn gthread 2x4 as ``importer serve`` ran it before,
granian 2 workers x 4 blocking threads) it measures, on its own redis-server:

* the bare WSGI app (bench/suite/bare_app.py) and Importer's app under wrk -t2 -c32
  POSTing 3-row CSVs (bench/suite/wrk_post.lua): req/s, p50, p99;
* 64 slow clients (no key, 1 byte per second: headers that never end, and a
  complete header block followed by a trickled body) while /health is asked
  once every 50 ms: /health p50, p99, max and failures; the same with a
  valid key (the body is read, after the key is checked).

The bare app runs under ``gunicorn ...`` / ``granian ...`` directly, Importer's
app under ``importer serve --server X`` (``granian-direct``: the granian CLI
with the app factory).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))

from importer.handlers.auth import hash_key  # noqa: E402

from bench.suite.http_load import parse_wrk  # noqa: E402

API_KEY = "imp_bench_" + "k" * 32
OTHER_KEY = "imp_other_" + "o" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(port: int, path: str, ok: tuple[int, ...], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                if r.status in ok:
                    return
        except urllib.error.HTTPError as e:
            if e.code in ok:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"server on {port} never answered {path}")


def start(kind: str, app: str, env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    if kind.startswith("gunicorn") and app == "bare":
        argv = [str(BIN / "gunicorn"), "bench.suite.bare_app:app", "--bind", f"127.0.0.1:{port}", "--workers", "2",
                "--threads", "4", "--worker-class", "gthread", "--log-level", "warning", "--chdir", str(ROOT)]
    elif kind.startswith("granian") and app == "bare":
        argv = [str(BIN / "granian"), "--interface", "wsgi", "--workers", "2", "--blocking-threads", "4",
                "--port", str(port), "--log-level", "warning", "--working-dir", str(ROOT), "bench.suite.bare_app:app"]
    elif kind == "granian-direct":
        argv = [str(BIN / "granian"), "--interface", "wsgi", "--workers", "2", "--blocking-threads", "4",
                "--port", str(port), "--log-level", "warning", "--factory", "importer.adapters.processes.wsgi_app:wsgi_app"]
    else:
        argv = [os.environ.get("BENCH_IMPORTER", str(BIN / "importer")), "serve", "--bind", f"127.0.0.1:{port}", "--workers", "2", "--threads", "4"]
        if not kind.endswith("-plain"):  # "-plain": a checkout whose serve has no --server (gunicorn)
            argv += ["--server", kind]
    log = open(tempfile.gettempdir() + f"/http-servers-{kind}-{app}.log", "wb")
    return subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=log, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_wrk(port: int, seconds: int, env: dict[str, str]) -> dict[str, float]:
    env = dict(env, BENCH_RUN_ID="s" + uuid.uuid4().hex[:8], BENCH_API_KEY=API_KEY)
    argv = ["/usr/bin/wrk", "-t2", "-c32", f"-d{seconds}s", "--latency", "-s", str(ROOT / "bench" / "suite" / "wrk_post.lua"),
            f"http://127.0.0.1:{port}/api/imports"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 60)
    return parse_wrk(done.stdout)


def slow_clients(port: int, n: int, mode: str, stop_evt: threading.Event) -> list[socket.socket]:
    """n connections sending one byte per second: 'headers' never finishes the
    header block; 'body' sends a whole header block (no key, Content-Length
    1 MiB) then trickles the body."""
    socks: list[socket.socket] = []
    if mode == "headers":
        script = b"POST /api/imports?batchId=slow HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 10_000
        first = b""
    else:
        auth = f"Authorization: Bearer {API_KEY}\r\n".encode() if mode == "body-with-key" else b""
        first = b"POST /api/imports?batchId=slow HTTP/1.1\r\nHost: x\r\nContent-Type: text/csv\r\n" + auth + b"Content-Length: 1048576\r\n\r\n"
        script = b"sku,quantity\n" + b"A,1\n" * 100_000
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            if first:
                s.sendall(first)
            socks.append(s)
        except OSError:
            pass

    def trickle() -> None:
        i = 0
        while not stop_evt.is_set():
            for s in list(socks):
                try:
                    s.send(script[i : i + 1])
                except OSError:
                    socks.remove(s)
            i += 1
            stop_evt.wait(1.0)

    threading.Thread(target=trickle, daemon=True).start()
    return socks


def health_latency(port: int, seconds: float) -> dict[str, float]:
    """/health and another owner's GET /api/imports/{id}, in turn, one every 50 ms."""
    times: dict[str, list[float]] = {"health": [], "get": []}
    failures = {"health": 0, "get": 0}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for name, request in (
            ("health", urllib.request.Request(f"http://127.0.0.1:{port}/health")),
            ("get", urllib.request.Request(f"http://127.0.0.1:{port}/api/imports/shipment-nope",
                                           headers={"Authorization": f"Bearer {OTHER_KEY}"})),
        ):
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=5) as r:
                    r.read()
            except urllib.error.HTTPError as err:
                err.read()  # the 404 is the answer
            except Exception:
                failures[name] += 1
                times[name].append(5000.0)
                continue
            times[name].append((time.perf_counter() - t0) * 1000)
            time.sleep(0.025)
    out: dict[str, float] = {}
    for name, values in times.items():
        values.sort()
        prefix = "" if name == "health" else "get_"
        out.update({
            f"{prefix}n": len(values), f"{prefix}failures": failures[name], f"{prefix}p50_ms": statistics.median(values),
            f"{prefix}p99_ms": values[min(len(values) - 1, int(len(values) * 0.99))], f"{prefix}max_ms": values[-1],
        })
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--only", default="gunicorn,granian")
    ap.add_argument("--skip-wrk", action="store_true")
    ap.add_argument("--skip-slow", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()

    rport = free_port()
    rdir = tempfile.mkdtemp(prefix="http-servers-redis-")
    redis_proc = subprocess.Popen(
        ["/usr/bin/redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", rdir, "--maxmemory-policy", "noeviction"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    base = dict(os.environ)
    env = dict(
        base, IMPORTER_REDIS_URL=f"redis://127.0.0.1:{rport}/0", IMPORTER_KEY_PREFIX="{bench}:", IMPORTER_RATE_LIMIT="0",
        IMPORTER_API_KEYS=f"bench:{hash_key(API_KEY)},other:{hash_key(OTHER_KEY)}", IMPORTER_HTTP_DRAIN_DELAY="0",
        IMPORTER_KEEP_COMPLETED_COUNT="10000000",
    )
    results: list[dict[str, object]] = []
    try:
        for rep in range(args.repeat):
            for kind in args.only.split(","):
                apps = [] if args.skip_wrk else ["bare", "importer"]
                for app in apps:
                    port = free_port()
                    proc = start(kind, app, env, port)
                    try:
                        wait_http(port, "/" if app == "bare" else "/health", (200, 202))
                        run_wrk(port, 1, env)
                        fig = run_wrk(port, args.seconds, env)
                        results.append({"server": kind, "app": app, "test": "wrk", **fig})
                        print(json.dumps(results[-1]), flush=True)
                    finally:
                        stop(proc)
                if args.skip_slow:
                    continue
                for mode in os.environ.get("BENCH_SLOW_MODES", "headers,body,body-with-key").split(","):
                    port = free_port()
                    proc = start(kind, "importer", env, port)
                    stop_evt = threading.Event()
                    try:
                        wait_http(port, "/health", (200,))
                        socks = slow_clients(port, 64, mode, stop_evt)
                        time.sleep(2)
                        fig = health_latency(port, 15)
                        fig["open_slow"] = len(socks)
                        results.append({"server": kind, "app": "importer", "test": f"slow-{mode}-64", **fig})
                        print(json.dumps(results[-1]), flush=True)
                    finally:
                        stop_evt.set()
                        stop(proc)
                        for s in socks:
                            s.close()
    finally:
        redis_proc.terminate()
        redis_proc.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
