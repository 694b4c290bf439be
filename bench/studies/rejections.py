"""Rejection reports: what a 100,000-row file with 30,000
bad rows costs. Not a test (timings on a shared machine are no verdict); run by hand:

    IMPORTER_REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python -m bench.studies.rejections

It starts a real `importer serve` + `importer worker` on their own key prefix
(tests/integration/support.py), posts the file, and prints: the validation
alone in process, the worker's attempt (startedAt -> finishedAt, the
scripts' clock), the same 100,000 rows all valid for comparison, the Redis
memory of the job record, its rejection report and its upload (MEMORY USAGE),
and GET .../rejections.csv (size, time). Its keys are removed at the end.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from importer.domain.shipment import parse_shipment

from tests.integration.support import System

ROWS, BAD_EVERY = 100_000, (0, 3, 6)  # rows whose index ends in 0, 3 or 6: 30,000


def files() -> tuple[bytes, bytes]:
    bad = "sku,quantity\n" + "".join(f"SKU-{i},{'x' if i % 10 in BAD_EVERY else 1}\n" for i in range(ROWS))
    good = "sku,quantity\n" + "".join(f"SKU-{i},1\n" for i in range(ROWS))
    return bad.encode(), good.encode()


def attempt_ms(record: dict) -> float:
    started, finished = (datetime.fromisoformat(record[k]) for k in ("startedAt", "finishedAt"))
    return (finished - started).total_seconds() * 1000


def main() -> int:
    url = os.environ.get("IMPORTER_REDIS_URL")
    if not url:
        print("set IMPORTER_REDIS_URL", file=sys.stderr)
        return 2
    bad, good = files()
    parse = []
    for _ in range(3):
        t0 = time.perf_counter()
        result = parse_shipment(bad)
        parse.append((time.perf_counter() - t0) * 1000)
    print(f"file: {len(bad) / 1e6:.2f} MB, {ROWS:,} rows, {result.found:,} issues found, {len(result.issues):,} kept")
    print(f"validation in process: median {statistics.median(parse):.0f} ms")

    with tempfile.TemporaryDirectory() as tmp:
        system = System(url, Path(tmp))
        try:
            system.start_worker()
            system.start_http()
            store = system.store()
            runs = []
            for n in range(3):
                system.post_csv(f"bench-bad-{n}", bad)
                runs.append(system.wait_state(f"shipment-bench-bad-{n}", timeout=300))
            system.post_csv("bench-good", good)
            ok = system.wait_state("shipment-bench-good", timeout=300)
            print(f"worker attempt, 30,000 bad rows (failed): {', '.join(f'{attempt_ms(r):.0f}' for r in runs)} ms")
            print(f"worker attempt, 100,000 valid rows (completed, for comparison): {attempt_ms(ok):.0f} ms")

            k, c = store.keys, store.client
            job_id = "shipment-bench-bad-0"
            upload_id = c.hget(k.job(job_id), "uploadId").decode()
            sizes = {
                "job record (hash)": c.memory_usage(k.job(job_id), samples=0),
                "  of which error JSON (bytes)": len(c.hget(k.job(job_id), "error")),
                "rejection report (string)": c.memory_usage(k.rejections(job_id), samples=0),
                "upload (string, kept with a failed job)": c.memory_usage(k.upload(upload_id), samples=0),
                "job event stream": c.memory_usage(k.job_events(job_id), samples=0),
            }
            for name, size in sizes.items():
                print(f"redis: {name}: {size / 1024:,.0f} KiB")

            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                status, _, body = system.request("GET", f"/api/imports/{job_id}/rejections.csv")
                times.append((time.perf_counter() - t0) * 1000)
            assert status == 200
            rows = body.count(b"\n") - 1
            print(f"GET rejections.csv: {len(body) / 1024:,.0f} KiB, {rows:,} rows + header, "
                  f"median {statistics.median(times):.0f} ms")
        finally:
            system.stop_all()
            client = system.store().client
            pattern = system.prefix.replace("{", "\\{").replace("}", "\\}") + "*"
            for key in client.scan_iter(match=pattern, count=1000):
                client.delete(key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
