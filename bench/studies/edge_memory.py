#!/usr/bin/env python3
"""HTTP edge figures: memory per upload and latency of
other owners during large uploads. A script, not a timed test.

    .venv/bin/python -m bench.studies.edge_memory [--importer PATH] [--repeat R]

1. peak RSS: a fresh ``importer serve --workers 1 --threads 4`` per shape;
   one POST of a maximal upload (IMPORTER_MAX_UPLOAD_BYTES, 10 MiB) shaped as
   commas, newlines or one long line; the server worker's VmHWM (from
   /proc/<pid>/status) over its idle VmRSS, and its VmRSS 2 s later;
2. owner B's ``GET /api/imports/{id}`` latencies (p50/p90/p99/max; B runs in
   its own process, one GET every ~2 ms) on ``importer serve`` with its
   defaults while owner A sends 8 uploads of 10 MiB of commas at once
   (3 rounds each), and what A's uploads got (202 / 503 busy). A's client
   behaves like curl: it watches for an early answer while sending.

``--importer`` runs another checkout's ``importer`` (e.g. the main branch's
.venv/bin/importer) for the "before" figures; ``--compare`` runs a second one
in turn with it (latency), so that both see the same machine load. Starts its own embedded valkey
(never the machine's 6379) unless IMPORTER_REDIS_URL is set, and a fresh key
prefix per run.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import multiprocessing.synchronize
import os
import random
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from importer.adapters.redis.embedded import EmbeddedRedis  # noqa: E402
from importer.handlers.auth import hash_key, new_key  # noqa: E402

MIB = 1024 * 1024
UPLOAD = 10 * MIB
HEADER = b"sku,quantity\n"
SHAPES = {
    "commas": HEADER + b"," * (UPLOAD - len(HEADER)),
    "newlines": HEADER + b"\n" * (UPLOAD - len(HEADER)),
    "one long line": HEADER + b"A" * (UPLOAD - len(HEADER)),
}


def valid_upload(rows: int = 100_000) -> bytes:
    """The largest valid file under the default limits: 100,000 rows (the row
    limit) of 64-character SKUs in shuffled order, about 7 MiB."""
    order = list(range(rows))
    random.Random(11).shuffle(order)
    return HEADER + b"".join(b"%s,%d\n" % (b"S%063d" % n, 1 + n % 999_999) for n in order)


#: Shapes of A's uploads in the latency measurement (--latency-shape).
LATENCY_SHAPES = {"commas": lambda: SHAPES["commas"], "valid": valid_upload}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for {pid}")


class Server:
    #: Extra environment of the server (--env NAME=VALUE).
    extra_env: dict[str, str] = {}

    def __init__(self, importer: str, redis_url: str, workers: int, threads: int, keys: dict[str, str]) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("IMPORTER_")}
        env.update(
            IMPORTER_REDIS_URL=redis_url,
            IMPORTER_KEY_PREFIX="{edge" + uuid.uuid4().hex[:8] + "}:",
            IMPORTER_QUEUE="edge-" + uuid.uuid4().hex[:8],
            IMPORTER_API_KEYS=",".join(f"{owner}:{hash_key(key)}" for owner, key in keys.items()),
            IMPORTER_RATE_LIMIT="0",
        )
        env.update(self.extra_env)
        self.log = tempfile.NamedTemporaryFile(prefix="edge-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [importer, "serve", "--bind", f"127.0.0.1:{self.port}", "--workers", str(workers), "--threads", str(threads)],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if self.request("GET", "/health")[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        else:
            raise RuntimeError(Path(self.log.name).read_text())
        # Wait for every worker to boot (each answers /health once it has).
        time.sleep(1.0)

    def workers(self) -> list[int]:
        pid = self.proc.pid
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

    def request(self, method: str, path: str, body: bytes | None = None, key: str | None = None,
                conn: http.client.HTTPConnection | None = None) -> tuple[int, bytes]:
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        headers = {"Content-Type": "text/csv"} if body is not None else {}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            if own:
                conn.close()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        os.unlink(self.log.name)


def peak_rss(importer: str, redis_url: str, body: bytes, key: str) -> tuple[float, float, float, int]:
    server = Server(importer, redis_url, 1, 4, {"owner-a": key})
    try:
        (worker,) = server.workers()
        server.request("GET", "/api/imports/x", key=key)  # warm: first authenticated request
        idle = status_kib(worker, "VmRSS")
        status, _ = server.request("POST", f"/api/imports?batchId=mem-{uuid.uuid4().hex[:8]}", body, key)
        peak = status_kib(worker, "VmHWM")
        time.sleep(2)
        after = status_kib(worker, "VmRSS")
        return idle / 1024, peak / 1024, after / 1024, status
    finally:
        server.stop()


def _owner_b(
    port: int, key: str, stop: "multiprocessing.synchronize.Event", out: "multiprocessing.Queue[list[tuple[float, float]]]"
) -> None:
    """In its own process (no GIL shared with the uploading threads): GETs in
    a loop; (when it started on the monotonic clock, seconds it took) each."""
    latencies: list[tuple[float, float]] = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {key}"}
    while not stop.is_set():
        started = time.monotonic()
        try:
            conn.request("GET", "/api/imports/shipment-nope", headers=headers)
            conn.getresponse().read()
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        latencies.append((started, time.monotonic() - started))
        time.sleep(0.002)
    conn.close()
    out.put(latencies)


def _redis_probe(
    redis_url: str, stop: "multiprocessing.synchronize.Event", out: "multiprocessing.Queue[list[tuple[float, float]]]"
) -> None:
    """In its own process: PING the Redis in a loop (what any Redis call of
    B's GET waits for when Redis itself is busy, e.g. storing an upload)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    latencies: list[tuple[float, float]] = []
    while not stop.is_set():
        started = time.monotonic()
        client.ping()
        latencies.append((started, time.monotonic() - started))
        time.sleep(0.002)
    out.put(latencies)


def upload(port: int, batch_id: str, body: bytes, key: str) -> int:
    """POST like curl does: send the body while watching for an early answer
    (401/429/503 come before the body is read) and stop sending when one comes."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(
            f"POST /api/imports?batchId={batch_id} HTTP/1.1\r\nHost: bench\r\nContent-Type: text/csv\r\n"
            f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        )
        view = memoryview(body)
        sent = 0
        answer = b""
        try:
            while sent < len(body):
                readable, writable, _ = select.select([sock], [sock], [], 60)
                if readable:
                    break
                if writable:
                    sent += sock.send(view[sent:sent + 256 * 1024])
            while b"\r\n" not in answer:
                piece = sock.recv(65536)
                if not piece:
                    break
                answer += piece
        except OSError:
            pass
        try:
            return int(answer.split(b" ", 2)[1])
        except (IndexError, ValueError):
            return 0


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples) or [0.0]
    n = len(ordered)
    return {
        "n": n, "p50_ms": 1000 * ordered[n // 2], "p90_ms": 1000 * ordered[int(n * 0.9)],
        "p99_ms": 1000 * ordered[min(n - 1, int(n * 0.99))], "max_ms": 1000 * ordered[-1],
    }


def latency_under_uploads(
    importer: str, redis_url: str, key_a: str, key_b: str, body: bytes, *, rounds: int = 3, retry: bool = False
) -> dict[str, object]:
    """``retry``: each of A's uploads that gets 503 busy is sent again after
    its Retry-After until it is accepted (sustained load: all 8 x rounds are
    handled); else each is sent once (a burst: most get 503 at once)."""
    server = Server(importer, redis_url, 2, 4, {"owner-a": key_a, "owner-b": key_b})
    try:
        upload_statuses: list[int] = []
        upload_times: list[float] = []
        ctx = multiprocessing.get_context("spawn")
        stop, out = ctx.Event(), ctx.Queue()

        def owner_a(n: int) -> None:
            for r in range(rounds):
                started = time.perf_counter()
                for _ in range(60):
                    status = upload(server.port, f"lat-{n}-{r}-{uuid.uuid4().hex[:6]}", body, key_a)
                    if not (retry and status in (0, 503)):
                        break
                    # 503 busy, or 0: the connection was reset before the
                    # answer could be read (the server answered early and closed)
                    upload_statuses.append(status)
                    time.sleep(1.0)
                upload_statuses.append(status)
                upload_times.append(time.perf_counter() - started)

        idle_stop, idle_out = ctx.Event(), ctx.Queue()
        idle_proc = ctx.Process(target=_owner_b, args=(server.port, key_b, idle_stop, idle_out))
        idle_proc.start()
        time.sleep(2.0)
        idle_stop.set()
        idle = sorted(t for _, t in idle_out.get(timeout=30))
        idle_proc.join()
        b = ctx.Process(target=_owner_b, args=(server.port, key_b, stop, out))
        b.start()
        probe_out: "multiprocessing.Queue[list[tuple[float, float]]]" = ctx.Queue()
        probe = ctx.Process(target=_redis_probe, args=(redis_url, stop, probe_out))
        probe.start()
        time.sleep(1.0)
        started = time.perf_counter()
        window_start = time.monotonic()
        uploaders = [threading.Thread(target=owner_a, args=(n,)) for n in range(8)]
        for t in uploaders:
            t.start()
        for t in uploaders:
            t.join()
        window_end = time.monotonic()
        elapsed = time.perf_counter() - started
        time.sleep(0.5)
        stop.set()
        samples = out.get(timeout=60)
        b.join()
        pings = probe_out.get(timeout=60)
        probe.join()
        rss = [status_kib(pid, "VmHWM") / 1024 for pid in server.workers()]
        return {
            "idle_p50_ms": 1000 * statistics.median(idle[10:] or idle),
            # Only B's GETs that started while A's uploads were under way (the
            # figures before 2026-11-30 also counted 1 s before them: "all").
            **_percentiles([t for start, t in samples if window_start <= start <= window_end]),
            "all": _percentiles([t for _, t in samples]),
            "redis_ping": _percentiles([t for start, t in pings if window_start <= start <= window_end]),
            "uploads": {s: upload_statuses.count(s) for s in sorted(set(upload_statuses))},
            "upload_median_s": statistics.median(upload_times),
            "elapsed_s": elapsed,
            "worker_peak_mib": rss,
        }
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--importer", default=str(ROOT / ".venv" / "bin" / "importer"))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--compare", help="another importer (e.g. a checkout of main) run in turn with --importer, for before/after")
    parser.add_argument("--only", default="rss,latency")
    parser.add_argument("--latency-shape", choices=sorted(LATENCY_SHAPES), default="commas")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--retry", action="store_true", help="A sends each upload refused 503 again after Retry-After until accepted")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server, e.g. IMPORTER_MAX_CONCURRENT_UPLOADS=1")
    args = parser.parse_args()
    Server.extra_env = dict(item.split("=", 1) for item in args.env)
    embedded = None
    redis_url = os.environ.get("IMPORTER_REDIS_URL")
    tmp = tempfile.TemporaryDirectory(prefix="edge-bench-")
    if not redis_url:
        embedded = EmbeddedRedis(Path(tmp.name) / "valkey")
        redis_url = embedded.start()
    key_a, key_b = new_key(), new_key()
    try:
        print(f"importer: {args.importer} {' '.join(args.env)}")
        if "rss" in args.only:
            print("peak RSS of the HTTP worker process (`importer serve`), one 10 MiB text/csv POST (MiB: idle -> peak (+over idle), 2 s later; status)")
            for shape, body in {**SHAPES, "valid (7 MiB)": valid_upload()}.items():
                over, back = [], []
                for _ in range(args.repeat):
                    idle, peak, after, status = peak_rss(args.importer, redis_url, body, key_a)
                    over.append(peak - idle)
                    back.append(after - idle)
                    print(f"  {shape:14s} {idle:6.1f} -> {peak:6.1f} (+{peak - idle:5.1f}), after {after:6.1f}; {status}", flush=True)
                print(f"  {shape:14s} median over {len(over)}: peak +{statistics.median(over):.1f} MiB over idle, 2 s later +{statistics.median(back):.1f} MiB")
        if "latency" in args.only:
            body = LATENCY_SHAPES[args.latency_shape]()
            print(
                f"owner B GET latency while owner A sends 8 uploads of {len(body) / MIB:.1f} MiB ({args.latency_shape}) at once "
                f"({args.rounds} rounds{', 503 retried after Retry-After' if args.retry else ''}), importer serve defaults"
            )
            importers = [args.importer] + ([args.compare] if args.compare else [])
            p99s: dict[str, list[float]] = {name: [] for name in importers}
            all_p99s: dict[str, list[float]] = {name: [] for name in importers}
            for _ in range(args.repeat):
                for importer in importers:  # interleaved: both see the same machine load
                    load = os.getloadavg()[0]
                    fig = latency_under_uploads(importer, redis_url, key_a, key_b, body, rounds=args.rounds, retry=args.retry)
                    p99s[importer].append(fig["p99_ms"])  # type: ignore[arg-type]
                    all_p99s[importer].append(fig["all"]["p99_ms"])  # type: ignore[index]
                    print(
                        f"  {'' if len(importers) == 1 else importer + ': '}load {load:.1f}; B idle p50 {fig['idle_p50_ms']:.2f} ms; "
                        f"during A's uploads: n={fig['n']} p50 {fig['p50_ms']:.1f} ms, "
                        f"p90 {fig['p90_ms']:.1f} ms, p99 {fig['p99_ms']:.1f} ms, max {fig['max_ms']:.1f} ms "
                        f"(with the second before: n={fig['all']['n']} p99 {fig['all']['p99_ms']:.1f} ms); "  # type: ignore[index]
                        f"Redis PING meanwhile p99 {fig['redis_ping']['p99_ms']:.1f} ms, max {fig['redis_ping']['max_ms']:.1f} ms; "  # type: ignore[index]
                        f"A's uploads {fig['uploads']} (median {fig['upload_median_s']:.2f} s, all in {fig['elapsed_s']:.1f} s); "
                        f"worker peaks {', '.join(f'{m:.0f}' for m in fig['worker_peak_mib'])} MiB", flush=True  # type: ignore[attr-defined]
                    )
            for importer in importers:
                print(
                    f"  {importer}: median over {len(p99s[importer])} runs: p99 during {statistics.median(p99s[importer]):.1f} ms "
                    f"(runs: {', '.join(f'{v:.0f}' for v in p99s[importer])}), "
                    f"p99 with the second before {statistics.median(all_p99s[importer]):.1f} ms"
                )
    finally:
        if embedded is not None:
            embedded.stop()
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
