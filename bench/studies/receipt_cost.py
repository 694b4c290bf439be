"""What a receipt costs: Redis memory of a 100,000-row receipt, the
extra time the apply script blocks Redis to write it, and what serving it
costs an HTTP process.

    .venv/bin/python -m bench.studies.receipt_cost [--rows 100000] [--repeat 7]

On its own valkey (never a shared Redis), in one run and interleaved, for
``--repeat`` repetitions:

* the product's apply script (adapters/lua/apply.lua, through RedisStore, as
  the worker calls it) on a fresh prefix, a fresh ``--rows``-row shipment;
* the same script with the receipt taken out (no receipt lines, no SET): the no-receipt baseline;
* an EVAL of a bare HINCRBY loop over the same rows (the bench's baseline for
  "Redis blocked by the apply script <= 1.3x").

Time is the server's own (SLOWLOG: the time Redis was blocked); medians are
printed beside each other. Then MEMORY USAGE of the receipt key and of the
done marker, and GET /api/shipments/{batchId}/receipt through the real WSGI
app (in process): time to the last byte and the peak Python memory while
the answer is produced (tracemalloc), JSON and CSV.
"""

from __future__ import annotations

import argparse
import io
import re
import statistics
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from importer.adapters.bootstrap import build_http, clock_ms  # noqa: E402
from importer.adapters.redis.embedded import EmbeddedRedis  # noqa: E402
from importer.adapters.redis.store import RedisStore  # noqa: E402
from importer.adapters.redis.scripts import lua_source  # noqa: E402
from importer.adapters.settings import Settings  # noqa: E402
from importer.domain.shipment import Row, Shipment, job_id_for  # noqa: E402
from importer.handlers.auth import hash_key, new_key  # noqa: E402

MIB = 1024 * 1024


#: The lines of apply.lua that make and store the receipt; the baseline is the script without them.
RECEIPT_LINES = (
    "local receipt, lines = {}, {}\n",
    "    lines[n + 1], lines[n + 2], lines[n + 3], lines[n + 4], lines[n + 5], lines[n + 6] =\n",
    "      sku, ',', before, ',', ARGV[i + 1], '\\n'\n",
    "    n = n + 6\n",
    "  receipt[#receipt + 1] = table.concat(lines, '', 1, n)\n",
    "redis.call('SET', KEYS[13], table.concat(receipt))\n",
)


#: Lines that serve the receipt and the stock write together: (line, the line without the receipt).
RECEIPT_SHARED_LINES = (("  local n, fields = 0, {}\n", "  local fields = {}\n"),)


def without_receipt(source: str) -> str:
    """apply.lua without the receipt: the same script without the lines that make and store it."""
    for line, replacement in RECEIPT_SHARED_LINES:
        if source.count(line) != 1:
            raise SystemExit(f"bench/studies/receipt_cost.py: apply.lua changed ({line.strip()!r}); update RECEIPT_SHARED_LINES")
        source = source.replace(line, replacement)
    for line in RECEIPT_LINES:
        if source.count(line) != 1:
            raise SystemExit(f"bench/studies/receipt_cost.py: apply.lua changed ({line.strip()!r}); update RECEIPT_LINES")
        source = source.replace(line, "")
    return source


def slowest_us(client: redis.Redis, command: bytes) -> int:
    entries = client.slowlog_get(-1)
    durations = [int(e["duration"]) for e in entries if _name(e) == command]
    if not durations:
        raise SystemExit(f"no {command.decode()} in SLOWLOG")
    return max(durations)


def _name(entry: dict[str, Any]) -> bytes:
    command = entry.get("command", b"")
    if isinstance(command, (list, tuple)):
        command = command[0] if command else b""
    if isinstance(command, str):
        command = command.encode()
    return command.split(b" ", 1)[0].upper()


def apply_once(client: redis.Redis, url: str, rows: list[Row], *, receipt: bool) -> tuple[float, RedisStore, str]:
    """One apply of a fresh shipment on a fresh prefix: (ms Redis was blocked, the store, batchId)."""
    prefix = "{rc" + uuid.uuid4().hex[:10] + "}:"
    store = RedisStore(redis.Redis.from_url(url, socket_timeout=120), Settings(key_prefix=prefix), clock_ms=clock_ms)
    if not receipt:
        store._scripts["apply"] = store.client.register_script(without_receipt(lua_source("apply")))
    batch_id = "bench-" + uuid.uuid4().hex[:8]
    job_id = job_id_for(batch_id)
    client.hset(store.keys.job(job_id), mapping={"id": job_id, "batchId": batch_id, "state": "active", "attempt": 1, "owner": "bench"})
    shipment = Shipment(tuple(rows))
    client.slowlog_reset()
    outcome = store.validated_and_apply(
        job_id=job_id, upload_id="0" * 32, attempt=1, batch_id=batch_id, owner="bench", shipment=shipment
    )
    if outcome.kind != "applied":
        raise SystemExit(f"apply answered {outcome.kind}")
    return slowest_us(client, b"EVALSHA") / 1000, store, batch_id


def bare_loop_ms(client: redis.Redis, rows: list[Row]) -> float:
    script = "for i = 1, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end return #ARGV / 2"
    key = "{rcbare" + uuid.uuid4().hex[:8] + "}:h"
    args: list[Any] = []
    for row in rows:
        args += [row.sku, row.quantity]
    client.slowlog_reset()
    client.eval(script, 1, key, *args)
    client.delete(key)
    return slowest_us(client, b"EVAL") / 1000


def drop_prefix(client: redis.Redis, store: RedisStore) -> None:
    pattern = store.keys.prefix.replace("{", "\\{").replace("}", "\\}") + "*"
    keys = list(client.scan_iter(match=pattern, count=1000))
    if keys:
        client.delete(*keys)


def serve_receipt(url: str, prefix: str, batch_id: str, accept: str, *, trace: bool) -> tuple[float, float, int]:
    """GET the receipt through the real WSGI app in process: (ms to the last byte, peak MiB allocated
    (tracemalloc, which slows allocation: timed runs are made without it), bytes)."""
    key = new_key()
    settings = Settings.from_env({
        "IMPORTER_REDIS_URL": url, "IMPORTER_KEY_PREFIX": prefix, "IMPORTER_API_KEYS": f"bench:{hash_key(key)}",
    })
    side = build_http(settings)
    try:
        environ = {
            "REQUEST_METHOD": "GET", "SCRIPT_NAME": "", "PATH_INFO": f"/api/shipments/{batch_id}/receipt",
            "QUERY_STRING": "", "SERVER_NAME": "bench", "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1",
            "wsgi.input": io.BytesIO(b""), "wsgi.url_scheme": "http",
            "HTTP_AUTHORIZATION": f"Bearer {key}", "HTTP_ACCEPT": accept,
        }
        statuses: list[str] = []
        if trace:
            tracemalloc.start()
        t = time.perf_counter()
        size = 0
        body = side.app(environ, lambda status, headers, exc=None: statuses.append(status))
        for part in body:
            size += len(part)
        close = getattr(body, "close", None)
        if close:
            close()
        elapsed = (time.perf_counter() - t) * 1000
        peak = 0
        if trace:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        if not statuses or not statuses[0].startswith("200"):
            raise SystemExit(f"GET receipt answered {statuses}")
        return elapsed, peak / MIB, size
    finally:
        side.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rows = [Row(f"SKU{i:07d}", (i % 1000) + 1) for i in range(args.rows)]

    tmp = Path(tempfile.mkdtemp(prefix="receipt-cost-"))
    server = EmbeddedRedis(tmp / "valkey")
    url = server.start()
    client = redis.Redis.from_url(url, socket_timeout=120)
    info = client.info("server")
    print(f"valkey {info.get('valkey_version') or info.get('redis_version')} at {url} (own server); "
          f"{args.rows:,} rows, {args.repeat} repetitions, interleaved")
    client.config_set("slowlog-max-len", 1000)
    client.config_set("slowlog-log-slower-than", 0)
    with_ms: list[float] = []
    without_ms: list[float] = []
    bare_ms: list[float] = []
    kept: tuple[RedisStore, str] | None = None
    try:
        for rep in range(args.repeat):
            order = (True, False) if rep % 2 == 0 else (False, True)
            for receipt in order:
                ms, store, batch_id = apply_once(client, url, rows, receipt=receipt)
                (with_ms if receipt else without_ms).append(ms)
                if receipt and kept is None:
                    kept = (store, batch_id)
                else:
                    drop_prefix(client, store)
            bare_ms.append(bare_loop_ms(client, rows))
            print(f"  rep {rep + 1}: with receipt {with_ms[-1]:.1f} ms, without {without_ms[-1]:.1f} ms, "
                  f"bare HINCRBY loop {bare_ms[-1]:.1f} ms", flush=True)
        assert kept is not None
        store, batch_id = kept
        receipt_key, done_key = store.keys.receipt(batch_id), store.keys.done(batch_id)
        receipt_bytes = int(client.strlen(receipt_key))
        receipt_mem = int(client.memory_usage(receipt_key, samples=0) or 0)
        done_mem = int(client.memory_usage(done_key, samples=0) or 0)
        small_rows = max(1, args.rows // 4)
        _, small_store, small_batch = apply_once(client, url, rows[:small_rows], receipt=True)
        small_peaks = {accept: serve_receipt(url, small_store.keys.prefix, small_batch, accept, trace=True)[1]
                       for accept in ("application/json", "text/csv")}
        served = {
            accept: ([serve_receipt(url, store.keys.prefix, batch_id, accept, trace=False) for _ in range(3)],
                     serve_receipt(url, store.keys.prefix, batch_id, accept, trace=True))
            for accept in ("application/json", "text/csv")
        }
    finally:
        client.close()
        server.stop()

    def med(values: list[float]) -> float:
        return statistics.median(values)

    w, wo, b = med(with_ms), med(without_ms), med(bare_ms)
    wm, wom, bm = min(with_ms), min(without_ms), min(bare_ms)
    # Ratios within each repetition (its runs are back to back): less exposed to the load of a shared machine.
    extra = med([x / y for x, y in zip(with_ms, without_ms)])
    w_bare = med([x / y for x, y in zip(with_ms, bare_ms)])
    wo_bare = med([x / y for x, y in zip(without_ms, bare_ms)])
    print()
    print(f"| {args.rows:,}-row shipment, {args.repeat} repetitions | with receipt | without (baseline) | with / without |")
    print("| --- | --- | --- | --- |")
    print(f"| Redis blocked by the apply script (SLOWLOG), median (min) | {w:.1f} ms ({wm:.1f}) | {wo:.1f} ms ({wom:.1f}) | "
          f"{extra:.2f}x (median of the repetitions' ratios; mins: {wm / wom:.2f}x) |")
    print(f"| ... / EVAL of a bare HINCRBY loop, {b:.1f} ms ({bm:.1f}): median of ratios (of mins) | "
          f"{w_bare:.2f}x ({wm / bm:.2f}x) | {wo_bare:.2f}x ({wom / bm:.2f}x) | target <= 1.3x |")
    print(f"| receipt key: MEMORY USAGE (STRLEN) | {receipt_mem / MIB:.2f} MiB ({receipt_bytes:,} B, "
          f"{receipt_mem / args.rows:.1f} B/row) | | done marker: {done_mem} B |")
    for accept, (runs, traced) in served.items():
        ms = statistics.median(r[0] for r in runs)
        peak = traced[1]
        size = runs[0][2]
        print(f"| GET receipt as {accept}, in-process WSGI (median of 3) | {ms:.0f} ms for {size / MIB:.2f} MiB | "
              f"peak Python allocation while producing it: {peak:.2f} MiB ({small_peaks[accept]:.2f} MiB for a "
              f"{small_rows:,}-row receipt: bounded, not the receipt's size) | |")


if __name__ == "__main__":
    main()
