"""What one POST /api/imports costs the HTTP process, in process (no HTTP
server, no other load of ours): CPU per 3-row POST and the time of a
100,000-row POST, through the real WSGI app and a real Redis-compatible
server, beside a bare WSGI app that makes the same kind of call.

    .venv/bin/python -m bench.studies.post_cost [--posts 5000] [--rows 100000] [--repeat 5]

On its own valkey (never a shared Redis), interleaved for ``--repeat``
rounds:

* Importer: ``create_app`` as ``importer serve`` builds it (build_http),
  POSTs of unique 3-row batches (text/csv, the rate limit off, as the bench's
  wrk scenario), then of one ``--rows``-row file under new batchIds;
* the baseline: a bare WSGI function that reads the body and runs one
  EVALSHA of a five-command script (HSET, SET of the body, XADD, HSET,
  RPUSH: the shape of enqueue.lua's writes) through redis-py, and answers
  a fixed 202.

CPU is this process's (user + system: the syscalls of the Redis round trip
included); medians of the rounds, and Importer ÷ baseline. A figure to
compare commits by (run it on each in turn): it leaves out what the HTTP
server adds per request (bench/suite/run.py's HTTP scenario measures that).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from importer.adapters.bootstrap import build_http  # noqa: E402
from importer.adapters.redis.embedded import EmbeddedRedis  # noqa: E402
from importer.adapters.settings import Settings  # noqa: E402
from importer.handlers.auth import hash_key, new_key  # noqa: E402

from bench.suite.model_apps import BASELINE_SCRIPT, baseline_call  # noqa: E402

SMALL = b"sku,quantity\nA-1,1\nB-2,2\nC-3,3\n"
_ACCEPTED = b'{"jobId":"shipment-x","batchId":"x","state":"waiting"}'

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def bare_app(client: redis.Redis) -> WsgiApp:
    script = client.register_script(BASELINE_SCRIPT)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
        keys, args = baseline_call("{b}:", body)
        script(keys=keys, args=args)
        start_response("202 Accepted", [("Content-Type", "application/json"), ("Content-Length", str(len(_ACCEPTED)))])
        return [_ACCEPTED]

    return app


def post(app: WsgiApp, key: str, batch_id: str, body: bytes) -> None:
    environ = {
        "REQUEST_METHOD": "POST", "PATH_INFO": "/api/imports", "QUERY_STRING": f"batchId={batch_id}",
        "CONTENT_TYPE": "text/csv", "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body),
        "HTTP_AUTHORIZATION": f"Bearer {key}", "HTTP_HOST": "127.0.0.1:8080", "HTTP_USER_AGENT": "bench",
        "SERVER_SOFTWARE": "bench", "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8080", "wsgi.url_scheme": "http",
    }
    statuses: list[str] = []
    for _ in app(environ, lambda status, headers, exc_info=None: statuses.append(status)):
        pass
    if not statuses or not statuses[0].startswith("202"):
        raise SystemExit(f"POST answered {statuses[:1]}")


def cpu_per_post_us(app: WsgiApp, key: str, posts: int, tag: str) -> float:
    for i in range(100):  # warm-up: lazy imports, the thread's connection
        post(app, key, f"{tag}-w{i}", SMALL)
    cpu = time.process_time()
    for i in range(posts):
        post(app, key, f"{tag}-{i}", SMALL)
    return (time.process_time() - cpu) / posts * 1e6


def large_post_ms(app: WsgiApp, key: str, body: bytes, tag: str) -> float:
    start = time.perf_counter()
    post(app, key, tag, body)
    return (time.perf_counter() - start) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--posts", type=int, default=5000)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="post-cost-")))
    url = server.start()
    try:
        key = new_key()
        settings = Settings.from_env({
            "IMPORTER_REDIS_URL": url, "IMPORTER_KEY_PREFIX": "{post-cost}:", "IMPORTER_API_KEYS": f"bench:{hash_key(key)}",
            "IMPORTER_RATE_LIMIT": "0", "IMPORTER_KEEP_COMPLETED_COUNT": "10000000",
        })
        side = build_http(settings)
        bare = bare_app(redis.Redis.from_url(url))
        large = ("sku,quantity\n" + "".join(f"SKU{i:07d},{i % 1000 + 1}\n" for i in range(args.rows))).encode()
        small: dict[str, list[float]] = {"importer": [], "bare": []}
        big: dict[str, list[float]] = {"importer": [], "bare": []}
        for rep in range(args.repeat):
            run = uuid.uuid4().hex[:8]
            small["importer"].append(cpu_per_post_us(side.app, key, args.posts, f"s{run}"))
            small["bare"].append(cpu_per_post_us(bare, key, args.posts, f"b{run}"))
            big["importer"].append(large_post_ms(side.app, key, large, f"L{run}"))
            big["bare"].append(large_post_ms(bare, key, large, f"B{run}"))
            print(f"round {rep + 1}: 3-row POST CPU {small['importer'][-1]:.0f} us (bare {small['bare'][-1]:.0f} us); "
                  f"{args.rows:,}-row POST {big['importer'][-1]:.1f} ms (bare {big['bare'][-1]:.1f} ms)", flush=True)
        side.close()
        print()
        print(f"| figure (median of {args.repeat}) | Importer | bare app, same kind of call | ratio |")
        print("| --- | --- | --- | --- |")
        for label, figs, unit in ((f"CPU per 3-row POST ({args.posts:,} POSTs)", small, "us"),
                                  (f"{args.rows:,}-row POST ({len(large) / 1024 / 1024:.1f} MiB), in process", big, "ms")):
            imp, base = statistics.median(figs["importer"]), statistics.median(figs["bare"])
            print(f"| {label} | {imp:,.1f} {unit} | {base:,.1f} {unit} | {imp / base:.2f}x |")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
